"""What the learner trains on: the Delta tables read with polars (tables), the fleet's supervision (teacher_labels),
steps decoded into batches (dataset), training views (augment), and action matching.
"""
