"""A job's state on a rank: the model, optimizer and progress (``elastic.py``), copied from a
survivor in bounded chunks or saved to disk, and rank 0's periodic checkpoints written off the step loop.
"""
