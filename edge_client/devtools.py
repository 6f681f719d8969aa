"""A synchronous Chrome DevTools Protocol (CDP) session on one page, over the page's own websocket.

Why: every WebDriver call goes Python -> HTTP -> chromedriver -> CDP -> Chromium and back, ~3.5 ms for an empty
script on this box; the same `Runtime.evaluate` straight on the page's websocket takes ~0.3 ms. The fast
environment path (edge_client.env) keeps chromedriver to start the browser, load pages and type, and speaks
CDP directly for what every step does: one page-side script, the click, the screenshot.

Errors: a CDP error reply, a script that throws, a closed socket or a timeout raise `DevToolsError`, a
`WebDriverException`, so the episode loop treats them as it treats a broken browser (the episode is lost);
GuiEnv's next reset opens a new session.
"""

from __future__ import annotations

import itertools
import json
import urllib.request
from typing import Any

import websocket
from selenium.common.exceptions import WebDriverException


class DevToolsError(WebDriverException):
    """The page's DevTools session failed: an error reply, a thrown script, a dead socket."""


def page_websocket_url(debugger_address: str, timeout_s: float = 10.0) -> str:
    """The websocket of the browser's (first) page, from its DevTools HTTP endpoint `host:port`."""
    try:
        with urllib.request.urlopen(f"http://{debugger_address}/json/list", timeout=timeout_s) as response:
            targets = json.load(response)
    except OSError as err:  # URLError is one: no browser listens there any more
        raise DevToolsError(f"DevTools endpoint {debugger_address} unreachable: {err!r}") from err
    pages = [t for t in targets if t.get("type") == "page" and "webSocketDebuggerUrl" in t]
    if not pages:
        raise DevToolsError(f"no page target at {debugger_address} (targets: {[t.get('type') for t in targets]})")
    return pages[0]["webSocketDebuggerUrl"]


class DevTools:
    """One CDP session: `call(method, **params)` sends a command and returns its result.

    No domain is enabled, so the page sends no events; any that arrive are skipped.
    """

    def __init__(self, websocket_url: str, timeout_s: float = 30.0):
        # Chromium refuses websocket upgrades that carry an Origin it was not told to allow; send none.
        self._socket = websocket.create_connection(websocket_url, timeout=timeout_s, suppress_origin=True)
        self._ids = itertools.count(1)

    @classmethod
    def for_page(cls, debugger_address: str, timeout_s: float = 30.0) -> DevTools:
        return cls(page_websocket_url(debugger_address), timeout_s)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call_all((method, params))[0]

    def call_all(self, *commands: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
        """Send the commands back to back, then wait for every reply: the page runs them in order, one after
        the other as it would one by one, without a round trip between them."""
        pending: dict[int, str] = {}
        replies: dict[int, dict[str, Any]] = {}
        try:
            for method, params in commands:
                request_id = next(self._ids)
                pending[request_id] = method
                self._socket.send(json.dumps({"id": request_id, "method": method, "params": params}))
            while len(replies) < len(pending):
                message = json.loads(self._socket.recv())
                if message.get("id") in pending:
                    replies[message["id"]] = message
        except (OSError, websocket.WebSocketException) as err:
            raise DevToolsError(f"{list(pending.values())}: DevTools connection failed: {err!r}") from err
        for request_id, method in pending.items():
            if "error" in replies[request_id]:
                raise DevToolsError(f"{method}: {replies[request_id]['error']}")
        return [replies[request_id]["result"] for request_id in pending]

    def evaluate(self, expression: str) -> Any:
        """The value of a page-side expression (awaited when it is a promise), as JSON."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise DevToolsError(f"page script failed: {text}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self._socket.close()
        except (OSError, websocket.WebSocketException):
            pass
