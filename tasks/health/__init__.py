"""Predictive device health: telemetry windows, fleet history, the LSTM risk model, scoring."""
