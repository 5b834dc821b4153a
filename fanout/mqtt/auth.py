"""Authentication (passwords, certificate CNs) and topic access control for the MQTT broker.

Strategy (the principals and the trust model they serve are described in :mod:`fanout.mqtt.principals`):

- Passwords are stored as ``pbkdf2_sha256$<iterations>$<salt b64>$<hash b64>`` (:mod:`passwords`). Every
  hash in the config is parsed when :class:`AccessControl` is built, so a malformed one stops
  start-up with ``users.<name>.password_hash: ...`` instead of silently refusing that user later.
- A verified client certificate authenticates its CN (:meth:`AccessControl.authenticate_certificate`).
- PBKDF2 at 600,000 iterations costs ~0.2-0.3 s of CPU by design, and a fleet of 10,000 vehicles sharing
  one credential may reconnect at once. Successful verifications are therefore cached in memory, keyed by
  ``HMAC-SHA256(k, username, password)`` where ``k`` is 32 random bytes drawn per ``AccessControl``
  (per process) and never persisted. Why this is safe: no plaintext password is stored; a key is only
  ever inserted after a full PBKDF2 verification succeeded against the immutable config of this instance,
  and a lookup needs the same username and password bytes (a collision of HMAC-SHA256 outputs is not a
  practical attack); the cache is bounded (LRU, 10,000 entries by default) and dies with the process.
  The remaining exposure is a memory dump of the live process, which yields ``k`` and the digests of
  recently used passwords (fast to brute force, unlike PBKDF2); whoever can dump the broker's memory can
  also read passwords from its socket buffers, so the cache does not widen that threat.
  Failed attempts are never cached as success; the last failed digest per user name (known or not, the
  unknown ones bounded) is remembered, so a client retrying one wrong password costs one PBKDF2 run, not
  one per connect. An unknown user name costs a PBKDF2 run against an unmatchable hash of the same
  iteration count, so timing does not reveal which users exist. Concurrent misses for the same credential
  (threads) share one PBKDF2 run. :meth:`AccessControl.authenticate_cached` answers what needs no PBKDF2
  on the caller's thread; the rest blocks its thread for the whole run, so the broker runs it in the
  bounded pool of :mod:`login_guard`.
- Authorisation: the extra ``[[acl]]`` rules in file order, first match decides; otherwise the role's
  built-in policy (DESIGN.md "MQTT contract"). Publishing to ``$SYS/#`` is refused to everyone but admin
  before any rule is consulted; outside development mode so are reading ``agent/X/#`` and publishing
  ``ecp/X/#`` to everyone but the vehicle of X (and admin). Publish decisions are cached per (principal,
  topic) in a dict bounded by entries and by the bytes of its keys (cleared when either is full: a client
  publishing to many long topics cannot grow it), since publish checks sit on the per-message hot path.
- ACL at delivery (:meth:`AccessControl.can_read`): the subscribe rules and role policy applied to the
  topic name of each message a session is given, cached per (principal, topic) the same way; a vehicle's
  own delivery topics skip the cache when no rule can apply there (each request id is a new topic).
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
import threading
from collections import OrderedDict
from typing import Callable, Iterable

import structlog

from .login_guard import LoginGuard
from .passwords import (
    DEFAULT_ITERATIONS, HASH_SCHEME, check_password_hashes, hash_password, parse_password_hash, unmatchable_hash,
    verify_password,
)
from .principals import Principal
from .settings import AclRule, ConfigError, MQTTSettings, UserConfig
from .topics import InvalidTopic, topic_matches, validate_topic_filter

log = structlog.get_logger(__name__)

CONNACK_BAD_CREDENTIALS = 4
CONNACK_NOT_AUTHORISED = 5
DEV_PLATFORM_USER = "platform"
DEV_PLATFORM_PASSWORD = b"platform"
_SYS = "$SYS"
_FANOUT = "$SDV-FANOUT"
_AGENT = "agent"  # the vehicles' inbox (fanout.topic_prefix default agent/{VIN}/proxy/request)
_ECP = "ecp"  # what vehicles report (ecp/<VIN>/online, heartbeat, ...)


def _under(topic: str, first_level: str) -> bool:
    """True when ``topic`` (a name or filter) is ``first_level`` or below it."""
    return topic == first_level or topic.startswith(first_level + "/")


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP addresses (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def filter_covers(outer: str, inner: str) -> bool:
    """True when every topic that filter ``inner`` can match is also matched by filter ``outer``.

    MQTT 3.1.1 matching is assumed: ``+`` matches one level (possibly empty), ``#`` any number of levels
    including the parent (``a/#`` matches ``a``), and a filter starting with a wildcard matches no topic
    starting with ``$``. Hence ``covers(f, f)`` holds, ``a/#`` covers ``a``, ``a/+`` and ``a/#``, ``+/b``
    does not cover ``$SYS/b``, ``a/+`` does not cover ``a/#``, ``+/#`` and ``#`` cover each other (every
    topic has at least one level; the empty string is no topic). Both arguments must be valid filters.

    Args:
        outer: the covering filter (an ACL rule's topic).
        inner: the filter being checked (a requested subscription).

    Returns:
        True when the topics matched by ``inner`` are a subset of those matched by ``outer``.
    """
    o, i = outer.split("/"), inner.split("/")
    for n, olevel in enumerate(o):
        if olevel == "#":
            # the rest of any topic matches, except a $-topic when '#' is the first level
            return not (n == 0 and i[0].startswith("$"))
        if n == len(i):
            return False  # outer needs more levels than inner's topics have
        ilevel = i[n]
        if olevel == "+":
            if ilevel == "#":
                # inner '#' also matches its parent topic, which outer '+' cannot, unless that parent is
                # no valid topic (empty: '#' itself, '/#') and outer continues with '#' ('+/#', '/+/#')
                return o[n + 1 :] == ["#"] and not "/".join(i[:n])
            if n == 0 and ilevel.startswith("$"):
                return False
        elif olevel != ilevel:
            return False
    return len(i) == len(o)


class _Flight:
    """One PBKDF2 verification in progress; concurrent callers with the same credential wait on it."""

    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False


class _DecisionCache:
    """Cached decisions and the bytes of client ids and topics their keys hold."""

    __slots__ = ("entries", "bytes")

    def __init__(self) -> None:
        self.entries: dict[tuple[str | None, str, str, str], bool] = {}
        self.bytes = 0


class AccessControl:
    """Authenticates CONNECTs and decides publish/subscribe permissions from one immutable config.

    Args:
        settings: the MQTT settings (users, acl, anonymous_role, dev_platform_login, vehicle_client_id).
        listener_is_loopback: whether the MQTT listener binds a loopback address only.
        auth_cache_size: successful verifications remembered (LRU).
        decision_cache_size: cached publish (and, apart, read) decisions (cleared when full).
        decision_cache_bytes: bytes of client ids and topics in each decision cache (cleared when over).

    Raises:
        ConfigError: a non-loopback listener without users, a malformed password hash, an invalid
            ACL topic filter, or an ACL rule naming an unknown user.
    """

    def __init__(
        self, settings: MQTTSettings, *, listener_is_loopback: bool, auth_cache_size: int = 10_000,
        decision_cache_size: int = 65_536, decision_cache_bytes: int = 16 << 20,
    ) -> None:
        self._users = {u.name: u for u in settings.users}
        if not self._users and not listener_is_loopback:
            raise ConfigError(
                "refusing to start a non-loopback listener without configured credentials "
                f"(mqtt.host = {settings.host!r}): add [users.<name>] tables with hashes from "
                "`fanout passwd`, or listen on 127.0.0.1"
            )
        check_password_hashes(self._users)
        self._anonymous_role: str = settings.anonymous_role
        self._vehicle_client_id = settings.vehicle_client_id
        # Development mode: a loopback listener with no users. Outside it the principal rules of the module
        # docstring hold; inside it an anonymous client may act as the vehicle its client id names.
        self.dev_mode = bool(not self._users and listener_is_loopback)
        self._dev_login = bool(self.dev_mode and settings.dev_platform_login)
        # role of a verified client certificate whose CN names no configured user (mqtt.cert_role)
        self._cert_role: str = settings.cert_role
        self._publish_rules = self._compile_rules(settings.acl, "publish")
        self._subscribe_rules = self._compile_rules(settings.acl, "subscribe")
        # whether some subscribe rule could apply to a vehicle under agent/ (then can_read has no shortcut there)
        vehicle_roles = ("vehicle", self._anonymous_role) if self.dev_mode else ("vehicle",)
        self._rules_reach_vehicles = any(
            r.topic.split("/", 1)[0] in (_AGENT, "+", "#") and (r.role is None or r.role in vehicle_roles)
            and (r.user is None or getattr(self._users.get(r.user), "role", None) == "vehicle")
            for r in self._subscribe_rules)
        self._key = secrets.token_bytes(32)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._last_failure: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self._pending: dict[bytes, _Flight] = {}
        self._auth_cache_size = auth_cache_size
        self._decisions = _DecisionCache()  # publish
        self._reads = _DecisionCache()  # read at delivery
        self._decision_cache_size = decision_cache_size
        self._decision_cache_bytes = decision_cache_bytes
        # An unknown user name costs the same PBKDF2 run as a known one (against this hash, which matches
        # nothing), so the answer time does not tell which users exist.
        dummy_iterations = max((parse_password_hash(u.password_hash)[0] for u in self._users.values()),
                               default=DEFAULT_ITERATIONS)
        dummy_hash = unmatchable_hash(dummy_iterations)
        self._dummy = UserConfig("", dummy_hash, "none")
        self._unknown_failures: dict[str, bytes] = {}  # bounded like _last_failure is by the user count
        self.guard = LoginGuard(
            limit_per_host=settings.auth_fail_limit_per_host, limit_total=settings.auth_fail_limit_total,
            window_ms=settings.auth_fail_window_ms, threads=settings.auth_threads, queue=settings.auth_queue,
        )
        self.login_executor = self.guard.executor
        self.pbkdf2_calls = 0  # PBKDF2 verifications run (observability and tests)
        self.auth_cache_hits = 0
        self.auth_failures = 0  # refused authentications (bad credentials, not authorised): metrics
        if self._dev_login:
            log.warning(
                "dev platform login enabled",
                username=DEV_PLATFORM_USER,
                hint="loopback listener without [users]; configure users or set mqtt.dev_platform_login = false",
            )

    def _compile_rules(self, acl: tuple[AclRule, ...], action: str) -> tuple[AclRule, ...]:
        rules = []
        for n, rule in enumerate(acl):
            try:
                validate_topic_filter(rule.topic)
            except InvalidTopic as exc:
                raise ConfigError(f"acl[{n}].topic: {exc}") from None
            known = rule.user in self._users or (self._dev_login and rule.user == DEV_PLATFORM_USER)
            if rule.user is not None and not known:
                raise ConfigError(f"acl[{n}].user: no [users.{rule.user}] is configured")
            if rule.action == action:
                rules.append(rule)
        return tuple(rules)

    # -- authentication ------------------------------------------------------------------------

    def authenticate(self, client_id: str, username: str | None, password: bytes | None,
                     cert_cn: str | None = None) -> Principal | int:
        """Authenticate one CONNECT.

        Args:
            client_id: the client identifier (as assigned, for a zero-length one).
            username: the CONNECT user name, or None when the flag is not set.
            password: the CONNECT password, or None when the flag is not set.
            cert_cn: the subject CN of the connection's verified client certificate, or None.

        Returns:
            The Principal, or a CONNACK return code: 4 (bad user name or password) for an unknown
            user, a wrong password or a password without user name; 5 (not authorised) for anonymous
            clients when ``anonymous_role`` is ``none``, for a vehicle whose client id is not a VIN
            (or, with a certificate, not its CN) and for a user name that is not the certificate's CN.
        """
        if cert_cn is not None:
            return self.authenticate_certificate(client_id, username, cert_cn)
        if username is None:
            if password is not None:
                return self._refuse(CONNACK_BAD_CREDENTIALS, client_id, None, "password without user name")
            if self._anonymous_role == "none":
                return self._refuse(CONNACK_NOT_AUTHORISED, client_id, None, "anonymous clients refused")
            return self._principal(None, self._anonymous_role, client_id)
        user = self._users.get(username)
        if user is None:
            if self._dev_login and username == DEV_PLATFORM_USER and password is not None:
                if hmac.compare_digest(password, DEV_PLATFORM_PASSWORD):
                    return self._principal(username, "platform", client_id)
            if self._users and password is not None:
                self._verify(self._dummy, password, username)  # the same cost as a known user's wrong password
            return self._refuse(CONNACK_BAD_CREDENTIALS, client_id, username, "unknown user or wrong password")
        if password is None or not self._verify(user, password):
            return self._refuse(CONNACK_BAD_CREDENTIALS, client_id, username, "unknown user or wrong password")
        return self._principal(username, user.role, client_id)

    def authenticate_certificate(self, client_id: str, username: str | None, cert_cn: str) -> Principal | int:
        """The principal of a verified client certificate (no password needed).

        A CN naming a ``[users.NAME]`` takes that user's role; any other CN takes ``mqtt.cert_role``. A
        vehicle's client id must equal its CN, so one vehicle certificate serves exactly one VIN. A
        CONNECT user name, when sent, must be the CN (a certificate never speaks for another user).
        """
        if username is not None and username != cert_cn:
            return self._refuse(CONNACK_NOT_AUTHORISED, client_id, username, "user name is not the certificate CN")
        user = self._users.get(cert_cn)
        role = user.role if user is not None else self._cert_role
        if role == "vehicle" and client_id != cert_cn:
            return self._refuse(CONNACK_NOT_AUTHORISED, client_id, cert_cn, "vehicle client id is not its certificate CN")
        return self._principal(cert_cn, role, client_id)

    def authenticate_cached(self, client_id: str, username: str | None, password: bytes | None) -> Principal | int | None:
        """The :meth:`authenticate` result when it needs no PBKDF2 run (answered on the caller's thread), else None.

        Answered from memory: anonymous, a password without user name, the dev login, a verified-password
        cache hit, and the remembered last failure of a user name (known or not, so both look alike).
        """
        if username is None or password is None or (self._dev_login and username == DEV_PLATFORM_USER):
            return self.authenticate(client_id, username, password)
        user = self._users.get(username)
        digest = self._digest(username, password)
        with self._lock:
            if user is not None and digest in self._verified:
                self._verified.move_to_end(digest)
                self.auth_cache_hits += 1
                hit = True
            elif (self._last_failure if user is not None else self._unknown_failures).get(username) == digest:
                hit = False
            else:
                return None
        if hit:
            return self._principal(username, user.role, client_id)  # type: ignore[union-attr]
        return self._refuse(CONNACK_BAD_CREDENTIALS, client_id, username, "unknown user or wrong password")

    def _digest(self, name: str, password: bytes) -> bytes:
        raw = name.encode("utf-8")
        return hmac.new(self._key, len(raw).to_bytes(4, "big") + raw + password, hashlib.sha256).digest()

    def _verify(self, user: UserConfig, password: bytes, unknown_name: str | None = None) -> bool:
        name = user.name if unknown_name is None else unknown_name
        failures = self._last_failure if unknown_name is None else self._unknown_failures
        digest = self._digest(name, password)
        with self._lock:
            if unknown_name is None and digest in self._verified:
                self._verified.move_to_end(digest)
                self.auth_cache_hits += 1
                return True
            if failures.get(name) == digest:
                return False
            flight = self._pending.get(digest)
            leader = flight is None
            if flight is None:
                flight = self._pending[digest] = _Flight()
                self.pbkdf2_calls += 1
        if not leader:  # the same credential is being verified by another thread: share its result
            flight.done.wait()
            return flight.ok
        ok = False
        try:
            ok = verify_password(password, user.password_hash)
        finally:
            with self._lock:
                if ok and unknown_name is None:
                    self._verified[digest] = None
                    if len(self._verified) > self._auth_cache_size:
                        self._verified.popitem(last=False)
                else:
                    if len(failures) >= self._auth_cache_size and name not in failures:
                        failures.clear()  # bounded: unknown user names are the attacker's choice
                    failures[name] = digest
                del self._pending[digest]
            flight.ok = ok
            flight.done.set()
        return ok

    def _principal(self, username: str | None, role: str, client_id: str) -> Principal | int:
        is_vin = self._vehicle_client_id.fullmatch(client_id) is not None
        if role == "vehicle" and not is_vin:
            return self._refuse(CONNACK_NOT_AUTHORISED, client_id, username, "vehicle client id is not a VIN")
        if username is None:
            # anonymous: the vehicle its client id names only in development mode (the demo stays simple)
            vehicle = self.dev_mode and is_vin
        else:
            vehicle = role == "vehicle"
        return Principal(username, role, client_id, vehicle, f"agent/{client_id}/" if vehicle else "")

    def _refuse(self, code: int, client_id: str, username: str | None, reason: str) -> int:
        with self._lock:  # authenticate runs in executor threads
            self.auth_failures += 1
        log.info("mqtt connect refused", client_id=client_id, username=username, return_code=code, reason=reason)
        return code

    # -- authorisation -------------------------------------------------------------------------

    def can_publish(self, principal: Principal, topic: str) -> bool:
        """Whether ``principal`` may publish to the topic name ``topic``.

        Decisions are cached per (principal, topic); the key is a flat tuple of strings, whose hashes
        CPython caches, because hashing the Principal dataclass runs Python code (~0.25 us) per call.

        Args:
            principal: the connection's Principal from :meth:`authenticate`.
            topic: a valid topic name (no wildcards).

        Returns:
            True when allowed (first matching publish rule, else the role's policy).
        """
        return self._cached(self._decisions, self._decide_publish, principal, topic)

    def _cached(self, cache: "_DecisionCache", decide: Callable[[Principal, str], bool], principal: Principal,
                topic: str) -> bool:
        """One decision through a cache bounded by entries and by the bytes of its keys (cleared when either is
        full: a client using many long topics cannot grow it), keyed by a flat tuple of strings."""
        key = (principal.username, principal.role, principal.client_id, topic)
        entries = cache.entries
        cached = entries.get(key)  # not entries[key] in a try: a KeyError costs compiled code a traceback frame
        if cached is not None:
            return cached
        decision = decide(principal, topic)
        size = len(topic) + len(principal.client_id)
        if len(entries) >= self._decision_cache_size or cache.bytes + size > self._decision_cache_bytes:
            entries.clear()
            cache.bytes = 0
        entries[key] = decision
        cache.bytes += size
        return decision

    def _decide_publish(self, p: Principal, topic: str) -> bool:
        if p.role == "admin":
            return self._first_rule(self._publish_rules, p, topic, topic_matches, True)
        if topic == _SYS or topic.startswith("$SYS/"):
            return False  # nobody but admin publishes $SYS, whatever the rules say
        if not self.dev_mode and _under(topic, _ECP) and not (p.vehicle and topic.startswith(f"ecp/{p.client_id}/")):
            return False  # (a): only the vehicle of VIN X publishes ecp/X/#, whatever the rules say
        if p.role == "platform":
            builtin = True
        elif p.role == "vehicle":
            builtin = topic.startswith(f"ecp/{p.client_id}/")
        else:
            builtin = not (topic == _FANOUT or topic.startswith("$SDV-FANOUT/"))
        return self._first_rule(self._publish_rules, p, topic, topic_matches, builtin)

    def can_subscribe(self, principal: Principal, topic_filter: str) -> bool:
        """Whether ``principal`` may subscribe to ``topic_filter`` (False -> SUBACK 0x80).

        Args:
            principal: the connection's Principal from :meth:`authenticate`.
            topic_filter: a valid topic filter; a subscribe rule applies when its filter covers this
                one (:func:`filter_covers`), so a deny of ``logs/#`` does not stop a subscription to ``#``.

        Returns:
            True when allowed (first matching subscribe rule, else the role's policy).
        """
        p = principal
        if p.role == "admin":
            builtin = True
        elif not self.dev_mode and _under(topic_filter, _AGENT) and not (
                p.vehicle and topic_filter.startswith(f"agent/{p.client_id}/")):
            return False  # (a): only the vehicle of VIN X reads agent/X/#, whatever the rules say
        elif topic_filter == _FANOUT or topic_filter.startswith("$SDV-FANOUT/"):
            cid = p.client_id
            builtin = bool(cid) and "+" not in cid and "#" not in cid and topic_filter in (
                f"$SDV-FANOUT/errors/{cid}", f"$SDV-FANOUT/replies/{cid}")
        elif p.role == "vehicle":
            builtin = topic_filter.startswith(f"agent/{p.client_id}/")
        else:
            builtin = True
        return self._first_rule(self._subscribe_rules, p, topic_filter, filter_covers, builtin)

    def can_read(self, principal: Principal, topic: str) -> bool:
        """Whether a message on the topic name ``topic`` may be delivered to ``principal`` (ACL at delivery).

        Held whatever filter matched: the subscribe rules apply to the topic itself (a rule's filter
        matching it, first match decides), then the role's policy for that topic, so a deny of
        ``test/nosubscribe`` also stops a ``test/#`` or ``#`` subscriber from receiving it. Cached per
        (principal, topic) in a bounded dict (cleared when full), like :meth:`can_publish`.
        """
        inbox = principal.inbox
        if inbox and topic.startswith(inbox) and not self._rules_reach_vehicles:
            # The fanout delivery path: a vehicle reading under agent/<own VIN>/, where no rule that could apply
            # to a vehicle matches, is allowed by its policy. No cache: every request id is a new topic.
            return True
        return self._cached(self._reads, self._decide_read, principal, topic)

    def reads_every_topic_under(self, p: Principal, prefix: str) -> bool:
        """Whether :meth:`can_read` allows ``p`` every topic ``prefix + x`` with ``x`` one level (no ``/``), so a
        caller that delivers many such topics (a fanout request id per message) may decide once per prefix.

        Conservative: False when a subscribe rule applies to ``p`` (a rule may name a last level) or the topics
        are under ``$SDV-FANOUT/`` (the one readable topic there is exact). Otherwise the built-in policy reads
        only ``startswith`` of prefixes ending in ``/`` of at most ``prefix``'s levels, which ``x`` cannot change.
        """
        if not prefix.endswith("/") or prefix.startswith(_FANOUT + "/"):
            return False
        for rule in self._subscribe_rules:
            if (rule.role is None or rule.role == p.role) and (rule.user is None or rule.user == p.username):
                return False
        return self._decide_read(p, prefix + "x")

    def _decide_read(self, p: Principal, topic: str) -> bool:
        if p.role == "admin":
            builtin = True
        elif not self.dev_mode and _under(topic, _AGENT) and not (p.vehicle and topic.startswith(f"agent/{p.client_id}/")):
            return False  # (a), as in can_subscribe
        elif topic == _FANOUT or topic.startswith("$SDV-FANOUT/"):
            builtin = topic in (f"$SDV-FANOUT/errors/{p.client_id}", f"$SDV-FANOUT/replies/{p.client_id}")
        elif p.role == "vehicle":
            builtin = topic.startswith(f"agent/{p.client_id}/")
        else:
            builtin = True
        return self._first_rule(self._subscribe_rules, p, topic, topic_matches, builtin)

    @staticmethod
    def _first_rule(
        rules: Iterable[AclRule], p: Principal, topic: str, match: Callable[[str, str], bool], default: bool
    ) -> bool:
        for rule in rules:
            if (rule.role is None or rule.role == p.role) and (rule.user is None or rule.user == p.username):
                if match(rule.topic, topic):
                    return rule.allow
        return default


__all__ = [
    "AccessControl", "Principal", "filter_covers", "hash_password", "verify_password", "parse_password_hash",
    "check_password_hashes", "is_loopback_host", "CONNACK_BAD_CREDENTIALS", "CONNACK_NOT_AUTHORISED", "HASH_SCHEME",
    "DEFAULT_ITERATIONS",
]
