"""Ray actors wrapping the Ray-free core (see each module's docstring for what it owns).

- :class:`actors.controller.Controller`: places and wires the others, status, inspect, housekeeping.
- :class:`actors.dispatcher.Dispatcher`: one LMDB shard and its VINs' dispatch state.
- :class:`actors.connection_node.ConnectionNode`: the MQTT listener of one Ray node.
- :class:`actors.store_replica.StoreReplica`: one replica of one shard's store.
- :mod:`actors.names`: what they share (namespace, controller name, ``fanout_node`` resource, remote errors).

Imports among these modules point one way: controller -> connection_node, shards; shards -> dispatcher,
store_replica; dispatcher -> primary_link -> store_replica; any of them -> names and shard_count (the shard count
chosen at start), which import none of them.

Import the submodules directly; this package imports nothing so that ``import actors`` stays cheap.
"""
