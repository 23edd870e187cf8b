"""What an operator runs through the `mvsink` command (`mvsink.cli`): the demos (`demo`, `ct_demo`), the stack
smoke check (`smoke`), topic inspection (`inspect`), provisioning of a sink's topics and shard
(`provision`) and the compose deployment (`compose`). Tools start the services as processes;
they never import them.
"""
