"""Fleet telemetry for Prometheus: `gpuflow telemetry serve`.

``snapshot`` samples a backend's devices and partitions once (with health risk, cordons and
leases) into metric families in DCGM exporter's names (hardware.dcgm_mapping); ``collector``
is the prometheus_client Collector that serves the last snapshot; ``exporter`` refreshes it
every interval on a thread and serves it over HTTP; ``service`` wires a backend, the
inventory and the health model into one exporter. docs/telemetry.md has the mapping table.
"""
