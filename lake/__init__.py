"""The lake: the Delta tables (names, schemas, locations), read-side queries, reader pins, and the local
S3-compatible object store the tables may live on."""
