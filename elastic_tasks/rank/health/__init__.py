"""A rank's peers going wrong: a failed collective as a type, a hung one freed by the control
plane, and persistent stragglers flagged.
"""
