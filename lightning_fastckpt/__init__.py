"""Lightning plugins over the fastckpt backend (FastCheckpointIO, TensorOffload): the Lightning issue."""
