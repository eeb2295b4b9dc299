"""ZeRO's communication buckets sized for the tests' small models. DeepSpeed's defaults are 5e8
elements: 2 GB per bucket, which torch's deterministic mode (fastckpt.reproducible) fills with NaN
at every engine start, seconds of CPU per process for a model of a few thousand parameters."""
SMALL_BUCKETS = {"reduce_bucket_size": 1 << 20, "allgather_bucket_size": 1 << 20,
                 "stage3_prefetch_bucket_size": 1 << 20}
