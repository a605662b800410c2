"""Locust load tests and the concurrency sweep: arrive with the load-test issue."""
