"""Principals: who a connection is, and the trust model the broker enforces for them (issue 11).

Principals. A connection's principal comes from its CONNECT (``[users.NAME]`` with a password), from its
verified TLS client certificate (the subject CN is the user name: a CN naming a ``[users.NAME]`` takes that
user's role, any other CN takes ``mqtt.cert_role``, default ``vehicle``; a vehicle's client id must equal its
CN, else CONNACK 0x05), or it is anonymous (``mqtt.anonymous_role``; ``none`` refuses them). Roles:

- ``vehicle`` (client id = VIN): reads ``agent/<own VIN>/#`` and ``$SDV-FANOUT/errors/<own VIN>``, publishes
  ``ecp/<own VIN>/#``; the only principal served that VIN's fanout rows and whose PUBACK deletes them;
- ``platform``: publishes ``$SDV-FANOUT/#`` (blobs, triggers) and anything but ``$SYS/#`` and ``ecp/#``;
  reads anything but ``agent/#`` (``ecp/#`` included) and other clients' ``$SDV-FANOUT/errors/...``;
- ``client``: as platform, without ``$SDV-FANOUT/#`` publishes;
- ``admin``: anything (``[[acl]]`` rules still apply to it).

``[[acl]]`` rules come first (first match decides) except for the hard rules: nobody but admin publishes
``$SYS/#``; outside development mode nobody but the vehicle of VIN X (and admin) reads ``agent/X/#`` or
publishes ``ecp/X/#``, whatever the rules say.

Development mode: a loopback listener with no users configured (the demo and quick tests). There an
anonymous client whose client id is a VIN IS that vehicle, the hard ``agent/``/``ecp/`` rules and the
session binding below are off, exactly as before issue 11. Everywhere else:

(a) a connection is a vehicle only when its principal is (:attr:`Principal.vehicle`): the node reports
    only those to the dispatchers (``fanout.node.core``), and ``Broker.deliver`` and routing hold the read
    rules at delivery, so nobody else receives or acknowledges X's rows or reads ``agent/X/#``;
(b) a session belongs to the principal that made it (:attr:`Principal.owner`: user name and role; the
    vehicle of VIN X is one owner whether it logs in with the fleet password or its certificate). A CONNECT
    with the client id of another owner's session (live or offline, clean session or not) is refused with
    CONNACK 0x02 (identifier rejected) and changes nothing: nobody resumes, reads, discards or takes over
    another principal's session. Refusing (rather than a fresh session) keeps one session per client id,
    which MQTT takeover and the cluster's takeover registry rely on;
(c) the takeover throttle counts only the owner's own takeovers (others are refused before it), and a
    vehicle always gets its own VIN: its CONNECT evicts a session another principal (anonymous, client)
    made with that id (:func:`may_evict`; the squatter's connection is closed, its will not published).
    Platform and admin sessions are not evicted by a vehicle login (a fleet credential is trusted less).
    Only vehicle connections take part in the cluster's cross-node takeover, so a squatter on another node
    cannot kick the vehicle either.

Threat model. Assumed hostile: any network client, including holders of a ``client`` login and anonymous
clients where allowed, and a stolen certificate or fleet password of one vehicle. Kept: (a)-(c) above,
the read/publish rules on every message, failed-login limits and a bounded PBKDF2 pool
(:mod:`fanout.mqtt.login_guard`), no user enumeration by timing. Not covered: a holder of the shared fleet
password IS every vehicle (use certificates: CN = VIN binds one credential to one VIN); anonymous clients
are one principal, so they can resume each other's sessions (production configs refuse anonymous); client
ids of ``client`` users share the namespace with VINs (a vehicle login evicts a client session of the same
id); a platform or admin login is trusted with what its role allows; non-vehicle client ids are taken over
per node only (not across nodes).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated connection: who it is (None = anonymous), its role and its client id.

    Attributes:
        username: the user name (a password login or a certificate's CN); None for anonymous clients.
        role: ``platform``, ``vehicle``, ``client`` or ``admin``.
        client_id: the connection's client id.
        vehicle: True when this principal IS the vehicle its client id names (role ``vehicle``, or an
            anonymous client in development mode): only such a connection is served fanout messages.
        owner: what a session made by this principal is bound to, ``(username, role, vehicle)``; a session is
            resumed only by a principal with the same owner (see :mod:`fanout.mqtt.lifecycle`).
    """

    username: str | None
    role: str
    client_id: str
    vehicle: bool = False
    inbox: str = field(default="", compare=False)  # "agent/<VIN>/" for a vehicle (can_read's shortcut)

    @property
    def owner(self) -> tuple[str | None, str, bool]:
        # The vehicle of VIN X is one principal however it logged in (fleet password or its certificate).
        return (None, "vehicle", True) if self.vehicle else (self.username, self.role, False)


def may_evict(newcomer: Principal, owner: Principal) -> bool:
    """Whether ``newcomer`` takes a client id whose session ``owner`` (another principal) made: a vehicle
    always gets its own VIN, unless the session is a platform's or admin's (trusted more than a fleet login)."""
    return newcomer.vehicle and owner.role not in ("platform", "admin")


__all__ = ["Principal", "may_evict"]
