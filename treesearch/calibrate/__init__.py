"""Calibration: fitting CGEE's thresholds and ASKS's gate on recorded data, and the data sets they fit on."""
