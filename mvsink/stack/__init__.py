"""The embedded stack: Kafka (KRaft, from Maven Central), MinIO (from its Go module), a Spark
standalone cluster and Toxiproxy, built from package registries and run as local processes
(`manager`; each a `component.Component`), with their record on disk (`state`), which also
injects the running stack's endpoints into the configuration (`state.stack_config`). Built on
`mvsink.io` (the configuration) and `mvsink.core`.
"""
