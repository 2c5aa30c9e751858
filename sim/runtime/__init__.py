"""The discrete-event run: one engine loop per replica, fast-forward over identical decode
steps, the inbox and routers in front of replicas, disaggregated pools, and the recorder."""
