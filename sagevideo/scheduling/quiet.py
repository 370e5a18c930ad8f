"""Keep Ray's own driver-side chatter off the user's terminal; sagevideo reports the same events itself.

- "(raylet) A worker died or was killed ..." (yellow ANSI, on stdout, where scripts read the
  summary line): the queue already prints one line per worker death and retries the job. Ray has
  no switch for these error messages, so its printer is wrapped to send raylet lines to the
  "sagevideo.ray" logger at DEBUG instead (worker output, log_to_driver, still passes through).
- "Token authentication is enabled for this Ray cluster ..." when a local instance starts: Ray
  telling that it secured the private instance, nothing to act on; dropped by a logging filter.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("sagevideo.ray")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TOKEN_LOGGER = "ray._private.authentication.authentication_token_setup"


class _DropTokenNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


def quiet_ray_driver() -> None:
    """Install both (idempotent; a Ray without the printer keeps its output)."""
    token_logger = logging.getLogger(_TOKEN_LOGGER)
    if not any(isinstance(f, _DropTokenNotice) for f in token_logger.filters):
        token_logger.addFilter(_DropTokenNotice())
    try:
        from ray._private import worker as ray_worker  # no public switch for the raylet lines
    except ImportError:
        return
    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "_sagevideo_quiet", False):
        return

    def print_to_stdstream(data, *args, **kwargs):
        if isinstance(data, dict) and data.get("pid") == "raylet":
            for line in data.get("lines") or []:
                log.debug("raylet: %s", _ANSI.sub("", str(line)))
            return None
        return printer(data, *args, **kwargs)

    print_to_stdstream._sagevideo_quiet = True
    ray_worker.print_to_stdstream = print_to_stdstream
