"""The wire protocol that the node and its clients share: frames, codes, the auth answer, addresses.

Light on purpose: msgpack, the pure codec's limits and the standard library, so that the
client library loads no server.
"""
