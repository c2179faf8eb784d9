"""System checks (`manage.py check`, tag `redis`): the Redis in use (settings.REDIS_URL) keeps
what Backstop needs of it (docs/RELIABILITY.md, "What Backstop needs of Redis").

Redis holds every running job's input, results, fencing epochs and supervision state. A Redis
that evicts keys (a `maxmemory` with a policy other than `noeviction`) drops them silently; one
that persists nothing (`appendonly no` and no RDB save point) comes back empty after a restart,
and one that persists by snapshots only comes back minutes old. The check asks Redis (CONFIG
GET, a 1 s timeout) and warns, naming the setting and its fix. An unreachable Redis gives one
warning of its own and nothing else.
"""

from __future__ import annotations

import redis
from django.conf import settings
from django.core.checks import Info, Warning, register

TIMEOUT_S = 1.0
DOC = "docs/RELIABILITY.md, 'What Backstop needs of Redis'"


def redis_config_warnings(config: dict[str, str], url: str) -> list:
    """The warnings about a Redis whose CONFIG GET answered `config` (pure, for tests)."""
    found = []
    maxmemory = int(config.get("maxmemory", "0") or 0)
    policy = config.get("maxmemory-policy", "noeviction")
    if maxmemory > 0 and policy != "noeviction":
        found.append(
            Warning(
                f"Redis at {url} evicts keys when full (maxmemory {maxmemory}, "
                f"maxmemory-policy {policy}): it would drop jobs' input streams, results and "
                "fencing epochs silently.",
                hint="Set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, "
                f"and in redis.conf): a full Redis then refuses writes visibly. See {DOC}.",
                id="console.W002",
            )
        )
    appendonly = config.get("appendonly", "no") == "yes"
    save = config.get("save", "").strip()
    if not appendonly and not save:
        found.append(
            Warning(
                f"Redis at {url} persists nothing (appendonly no, no save points): a restart "
                "comes back empty and every running job fails (its input, results and "
                "fencing epochs are gone).",
                hint="Set appendonly yes with appendfsync everysec (CONFIG SET appendonly yes, "
                f"and in redis.conf). See {DOC}.",
                id="console.W003",
            )
        )
    elif not appendonly:
        found.append(
            Warning(
                f"Redis at {url} persists by snapshots only (appendonly no, save '{save}'): a "
                "crash brings back a snapshot minutes old (older input, results and fencing "
                "epochs than the running stages hold).",
                hint=f"Set appendonly yes with appendfsync everysec. See {DOC}.",
                id="console.W004",
            )
        )
    return found


def where(client) -> str:
    """host:port/db of a client's Redis, without the credentials a REDIS_URL may hold."""
    conn = client.connection_pool.connection_kwargs
    if "path" in conn:
        return f"unix:{conn['path']}"
    return f"{conn.get('host', 'localhost')}:{conn.get('port', 6379)}/{conn.get('db', 0)}"


@register("redis")
def check_redis_persistence(app_configs=None, **kwargs) -> list:
    """Warn when the Redis in use would evict or lose Backstop's keys (see the module)."""
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=TIMEOUT_S,
        socket_timeout=TIMEOUT_S,
        decode_responses=True,
        retry=None,
    )
    shown = where(client)
    try:
        config = client.config_get("appendonly")
        config.update(client.config_get("save"))
        config.update(client.config_get("maxmemory*"))
    except redis.ResponseError as exc:  # CONFIG renamed or refused (a managed Redis)
        return [
            Info(
                f"Could not read the configuration of Redis at {shown} ({exc}): make sure it "
                "has appendonly yes and maxmemory-policy noeviction.",
                hint=DOC,
                id="console.I001",
            )
        ]
    except redis.RedisError as exc:
        return [
            Warning(
                f"Redis at {shown} did not answer ({exc.__class__.__name__}: {exc}), so its "
                "persistence and eviction settings were not checked.",
                hint="Start Redis, or set REDIS_URL to the Redis Backstop uses.",
                id="console.W001",
            )
        ]
    finally:
        client.close()
    return redis_config_warnings(config, shown)
