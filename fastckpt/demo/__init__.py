"""The demo job: train, checkpoint with fastckpt, kill -9, resume bit-exactly, compare with torch.save."""
