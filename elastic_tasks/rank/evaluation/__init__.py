"""A job's evaluation on its ranks, periodic and final, and when it is due.
"""
