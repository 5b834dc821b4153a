"""What every benchmark stands on: the servers it measures, the machine it measures on, and its output.

- :mod:`.processes`: a child server process (temporary folder, log, ready line, bounded stop) and what
  ``/proc`` says about a process (CPU, RSS); the descriptor limit (:func:`~.processes.processes_for`).
- :mod:`.peers`: :class:`~.peers.PeerBroker`, one broker (``fanout broker``, Mosquitto, amqtt) per ``with``.
- :mod:`.cluster`: :class:`~.cluster.EmbeddedCluster`, ``fanout up`` per ``with``, its processes by role.
- :mod:`.profiles`: py-spy on running processes, summarised as top functions.
- :mod:`.versions`: the code a figure was measured with (git commit, uncommitted files, peer versions).
- :mod:`.results`: the JSON result of a run with its machine, load and versions.
- :mod:`.plots`: the PNG of a run (grouped bars per system, labelled bars, machine title).
- :mod:`.report`: phases run one by one (bounded, quiet machine first), ratios and target verdicts.
"""
