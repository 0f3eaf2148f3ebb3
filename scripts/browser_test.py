#!/usr/bin/env python3
"""`make test-browser` (issue 27): the status page behind an admin_token, in a real browser.

Starts two `crossbar-sim`s and a `crossbar serve` with an admin_token and a client key on
127.0.0.1 (a third host is down: nothing listens on its port), sends a few conversations through
it so the charts have data, then drives headless Chromium over the DevTools
protocol (on a pipe: `--remote-debugging-pipe`, so nothing but the standard library is needed):
it opens the page and gets the sign-in form, signs in with the form, checks the session cookie's
flags (HttpOnly, SameSite=Strict, not the token) and that the page shows its charts, takes a
screenshot, checks that nothing overflows the window at 1400 and 1900 px wide (issue 48: the hosts
table did, with a real host's model path and a down host's reason) with a screenshot at each, then
uses the page's one action, "Sign out", and checks the form is back. Last, the log must not hold
the token. Prints one line per step with its time; exits 0 only if all pass.

usage: browser_test.py BIN_DIR SCREENSHOT.png (the 1400 and 1900 px ones go to BIN_DIR/../)
"""

import base64
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

STEP_START = time.monotonic()


def step(text):
    print(f"browser-test: {time.monotonic() - STEP_START:5.1f}s {text}", flush=True)


def fail(text):
    print(f"browser-test: FAILED: {text}", file=sys.stderr, flush=True)
    sys.exit(1)


def wait_line(path, needle, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if needle in line:
                    return line.strip()
        time.sleep(0.05)
    with open(path, encoding="utf-8", errors="replace") as f:
        fail(f"no {needle!r} in {path}:\n{f.read()}")


class Browser:
    """Headless Chromium driven over --remote-debugging-pipe: JSON messages ended by NUL, commands
    on the child's fd 3, answers and events on its fd 4."""

    def __init__(self, chromium, profile):
        to_child_r, self.to_child = os.pipe()
        self.from_child, from_child_w = os.pipe()

        def fds():
            # Whatever numbers the pipes got, the child must see them as 3 and 4.
            import fcntl
            high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 100)
            high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 100)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
             "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=fds, pass_fds=(3, 4), close_fds=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def send(self, method, params=None, session=True, timeout=15.0):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            message["sessionId"] = self.session
        os.write(self.to_child, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self.read(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    fail(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def read(self, deadline):
        import select
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.from_child], [], [], left)[0]:
                fail("the browser did not answer in time")
            chunk = os.read(self.from_child, 1 << 16)
            if not chunk:
                fail("the browser closed its pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def wait_event(self, method, timeout=15.0):
        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if event.get("method") == method:
                    del self.events[i]
                    return event
            self.events.append(self.read(deadline))

    def load(self, action):
        """Runs `action` (a navigation or a form submit) and waits for the page it loads."""
        self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
        action()
        self.wait_event("Page.loadEventFired")

    def js(self, expression):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            fail(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except SystemExit:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    bin_dir, screenshot = sys.argv[1], sys.argv[2]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        fail("no chromium (Debian: apt-get install chromium)")
    work = tempfile.mkdtemp(prefix="crossbar-browser.")
    token = "tok-" + secrets.token_hex(16)
    key = "cb-" + secrets.token_hex(16)
    key_hash = "sha256:" + hashlib.sha256(key.encode()).hexdigest()
    children = []
    browser = None
    try:
        # titan lists its model by the file's path, as llama-server does when started without -a.
        sims = {}
        for name, alias in [("titan", "/srv/models/Qwen2.5-Coder-32B-Instruct-Q4_K_M.gguf"),
                            ("mini", "qwen-coder")]:
            sim_out = os.path.join(work, f"{name}.out")
            with open(sim_out, "w") as out:
                children.append(subprocess.Popen(
                    [os.path.join(bin_dir, "crossbar-sim"), "--listen", "127.0.0.1:0", "--alias",
                     alias, "--slots", "2", "--prefill-us", "300"],
                    stdout=out, stderr=subprocess.STDOUT))
            sims[name] = wait_line(sim_out, "sim listening on ").split("on ", 1)[1]
        listen, admin, nobody = free_port(), free_port(), free_port()
        config = os.path.join(work, "crossbar.toml")
        hosts = "".join(f'[hosts.{name}]\nurl = "{url}"\n[hosts.{name}.models.qwen-coder]\n'
                        'parallel = 2\n'
                        for name, url in [*sims.items(), ("gpu-box-3", f"http://127.0.0.1:{nobody}")])
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{listen}"\nadmin_listen = "127.0.0.1:{admin}"\n'
                    f'admin_token = "{token}"\ndb = "crossbar.db"\nhealth_interval = "1s"\n'
                    f'{hosts}[routes.projA]\nhosts = ["titan", "mini", "gpu-box-3"]\n'
                    f'model = "qwen-coder"\n[keys.laptop]\nhash = "{key_hash}"\n')
        log = os.path.join(work, "crossbar.log")
        with open(log, "w") as err:
            children.append(subprocess.Popen(
                [os.path.join(bin_dir, "crossbar"), "serve", "-c", config],
                stdout=subprocess.DEVNULL, stderr=err))
        wait_line(log, "crossbar listening")
        wait_line(log, "host up host=titan")
        wait_line(log, "host up host=mini")
        wait_line(log, "host down host=gpu-box-3")
        for conversation in range(6):
            messages = [{"role": "system", "content": f"You are terse. Team {conversation % 3}."}]
            for turn in range(3):
                messages.append({"role": "user", "content": f"question {conversation}.{turn}"})
                body = json.dumps({"messages": messages, "max_tokens": 8}).encode()
                request = urllib.request.Request(
                    f"http://127.0.0.1:{listen}/projA/v1/chat/completions", data=body,
                    headers={"Content-Type": "application/json",
                             "Authorization": f"Bearer {key}"})
                with urllib.request.urlopen(request, timeout=10) as answer:
                    reply = json.load(answer)["choices"][0]["message"]["content"]
                messages.append({"role": "assistant", "content": reply})
        step(f"crossbar with admin_token on 127.0.0.1:{admin}, 18 turns served through it")

        browser = Browser(chromium, os.path.join(work, "profile"))
        target = browser.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = browser.send("Target.attachToTarget",
                                {"targetId": target["targetId"], "flatten": True}, session=False)
        browser.session = attached["sessionId"]
        browser.send("Page.enable")
        browser.send("Network.enable")
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False})
        page = f"http://127.0.0.1:{admin}/"
        step(f"headless {subprocess.run([chromium, '--version'], capture_output=True, text=True).stdout.strip()} started")

        browser.load(lambda: browser.send("Page.navigate", {"url": page}))
        if browser.js("document.title") != "crossbar: sign in":
            fail(f"the page without a session is not the sign-in form: {browser.js('document.title')}")
        step("the page shows the sign-in form")

        browser.js("document.querySelector('input[name=token]').value = 'wrong'")
        browser.load(lambda: browser.js("document.querySelector('form').submit()"))
        if "not this gateway's admin token" not in browser.js("document.body.innerText"):
            fail("a wrong token was not refused")
        if browser.send("Network.getCookies", {"urls": [page]})["cookies"]:
            fail("a wrong token set a cookie")
        step("a wrong token is refused, no cookie")

        browser.js(f"document.querySelector('input[name=token]').value = {json.dumps(token)}")
        browser.load(lambda: browser.js("document.querySelector('form').submit()"))
        url = browser.js("location.href")
        if url != page or browser.js("document.title") != "crossbar":
            fail(f"after signing in: {url} {browser.js('document.title')}")
        cookies = browser.send("Network.getCookies", {"urls": [page]})["cookies"]
        ours = [c for c in cookies if c["name"] == "crossbar_session"]
        if len(ours) != 1:
            fail(f"cookies after signing in: {cookies}")
        cookie = ours[0]
        checks = {"httpOnly": cookie["httpOnly"], "sameSite Strict": cookie.get("sameSite") == "Strict",
                  "not the token": token not in cookie["value"], "64 hex digits": len(cookie["value"]) == 64,
                  "hidden from scripts": browser.js("document.cookie") == ""}
        if not all(checks.values()):
            fail(f"cookie {cookie}: {checks}")
        step("signed in: 303 to the page, cookie " + ", ".join(checks))

        text = browser.js("document.body.innerText")
        charts = browser.js("document.querySelectorAll('svg').length")
        if "served from cache" not in text or not charts:
            fail(f"the page lacks its headline or charts ({charts} svg):\n{text[:500]}")
        height = browser.js("document.documentElement.scrollHeight")
        browser.send("Emulation.setDeviceMetricsOverride",
                     {"width": 1280, "height": min(int(height), 4000), "deviceScaleFactor": 1,
                      "mobile": False})
        shot = browser.send("Page.captureScreenshot", {"format": "png"})
        with open(screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        step(f"the page shows 'served from cache' and {charts} charts; screenshot {screenshot} "
             f"({os.path.getsize(screenshot) // 1024} KiB, 1280x{min(int(height), 4000)})")

        # Issue 48: at 1400 and 1900 px the hosts table ran off the window.
        for width in (1400, 1900):
            browser.send("Emulation.setDeviceMetricsOverride",
                         {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
            browser.load(lambda: browser.send("Page.reload"))
            over = browser.js(
                "[...document.querySelectorAll('table')].map(t => [t.previousElementSibling ? "
                "t.previousElementSibling.textContent : '', Math.ceil(t.getBoundingClientRect().right)])"
                ".filter(([_, right]) => right > window.innerWidth)")
            wide = browser.js("document.documentElement.scrollWidth")
            if over or wide > width:
                fail(f"at {width} px the page is {wide} px wide; tables past the window: {over}")
            height = browser.js("document.documentElement.scrollHeight")
            browser.send("Emulation.setDeviceMetricsOverride",
                         {"width": width, "height": min(int(height), 4000), "deviceScaleFactor": 1,
                          "mobile": False})
            shot = browser.send("Page.captureScreenshot", {"format": "png"})
            path = os.path.join(os.path.dirname(os.path.abspath(bin_dir)), f"status-page-{width}.png")
            with open(path, "wb") as f:
                f.write(base64.b64decode(shot["data"]))
            step(f"at {width} px every table fits the window ({wide} px wide); screenshot {path}")

        actions = browser.js("[...document.querySelectorAll('form')].map(f => f.getAttribute('action'))")
        if actions != ["/signout"]:
            fail(f"the page's actions: {actions}")
        browser.load(lambda: browser.js("document.querySelector('form[action=\"/signout\"]').submit()"))
        if browser.js("document.title") != "crossbar: sign in":
            fail("signing out did not bring the form back")
        if browser.send("Network.getCookies", {"urls": [page]})["cookies"]:
            fail("the cookie outlived signing out")
        browser.load(lambda: browser.send("Page.navigate", {"url": page}))
        if browser.js("document.title") != "crossbar: sign in":
            fail("the page opened again after signing out")
        step("the page's one action, Sign out: session ended, cookie gone, the form is back")
    finally:
        if browser:
            browser.close()
        for child in reversed(children):
            child.terminate()
            child.wait(timeout=10)
    with open(log, encoding="utf-8") as f:
        text = f.read()
    if token in text:
        fail("the token is in crossbar's log")
    if "admin signed in" not in text or "admin signed out" not in text:
        fail(f"the log lacks the sign-in and sign-out lines:\n{text}")
    shutil.rmtree(work, ignore_errors=True)
    step("the token is in no log line; ok")


if __name__ == "__main__":
    main()
