"""The edges: configuration and the clients mvsink talks through.

The configuration from its sources (`config`, `ct_definition`), Kafka (`kafka`), object storage
(`s3`), the Spark session and code shipping (`spark`), and the service runtime every deployed
process runs under: health, metrics and outage handling (`health`, `service`). Built on
`mvsink.core` alone: the embedded stack's endpoints are passed in (`mvsink.stack.state`).
"""
