"""Energy: power limits and clocks chosen per device and workload."""
