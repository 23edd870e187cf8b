"""The upstream side of a sink: what writes and reads the desired collection.

A process producing desired updates (`producer.DesiredProducer`), a Spark DataFrame published
from its executors (`publish.publish_dataframe`), and decoding desired records back into update
tables (`desired`).
"""
