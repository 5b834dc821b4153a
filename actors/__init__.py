"""Ray actors wrapping the Ray-free core (see each module's docstring for what it owns).

- :class:`actors.controller.Controller`: places and wires the others, status, inspect, housekeeping.
- :class:`actors.dispatcher.Dispatcher`: one LMDB shard and its VINs' dispatch state.
- :class:`actors.connection_node.ConnectionNode`: the MQTT listener of one Ray node.

Import the submodules directly; this package imports nothing so that ``import actors`` stays cheap.
"""
