"""DeepSpeed checkpoint engine selected by a "fastckpt" entry in the DeepSpeed config: the DeepSpeed issue."""
