"""The scale benchmark's parts: fake TPU pools (kwok), the peers, workloads, measurements."""
