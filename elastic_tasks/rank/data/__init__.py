"""What a rank reads: its deterministic share of the sample stream, and the DataLoader over it.
"""
