"""The alerting page: routes and the deliveries of their alerts."""
