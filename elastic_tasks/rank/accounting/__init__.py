"""A rank's accounting of its own steps: the values a step left on the device (``pending``), the
records it streams (``step_history``, ``records``) and where its wall time went (``wall_split``)."""
