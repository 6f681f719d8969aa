"""Stream processors: steps -> episode assembly -> scoring -> curation -> Delta tables."""
