"""The Ray Serve application (ingress, model deployments, builder): arrives with the serving issue."""
