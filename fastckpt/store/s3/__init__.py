"""Checkpoints in an object store (S3 and S3-compatible servers), through the store seam.

  place.py     an `s3://bucket/prefix` URL parsed: the bucket, the key prefix, keys under it
  client.py    the connection (Bucket): endpoint, region and credentials as every AWS tool reads
               them; the data through obstore, unfinished multipart uploads listed and aborted
               through boto3; every call bounded
  spool.py     the local folder a part is written to before its upload, and downloaded to before a load
  checked.py   a checkpoint's record read and checked against the listed objects (sizes, ETags):
               the S3 store's and DCP's on S3
  s3_store.py  "s3": the Checkpointer's layout in a bucket, committed by a record object written
               once (a conditional PUT) and then `latest`: S3 has no rename
  object_path.py  an s3:// path as the tier behind a memory copy (Lightning's `.ckpt` in a bucket)
  folder_mirror.py  a local parent's committed folders (DeepSpeed's tags) mirrored in a bucket:
               uploaded from the committed copy
  folder_fetch.py  one of those folders fetched back into the parent on every rank, each object
               checked before it lands
"""
