"""RKSC's policies as pure rules: ASKS (the gate and its shipped calibration), CGEE (early exit)
and RSBCM (eviction order). Import only `treesearch.common`."""
