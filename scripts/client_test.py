#!/usr/bin/env python3
"""`make test-clients` (issue 48): docs/CLIENTS.md's snippets against a real crossbar.

Starts a `crossbar-sim` and two `crossbar serve`s on 127.0.0.1, one without client keys and one
with a key, then, for each, runs what docs/CLIENTS.md shows (its blocks marked
`<!-- client-test: NAME -->`, with `http://gateway:8080` replaced by the crossbar's address):

- the OpenAI and Anthropic SDK snippets as written, with the Python that has the SDKs;
- Open WebUI's and aider's settings and Codex's `model_providers` entry as the requests those
  clients make with them (replayed here);
- Claude Code and Codex themselves, when NPM_DIR holds them and this runs in a network namespace
  with nothing but loopback (scripts/client-test.sh sees to both);
- the mistakes the doc names, through the SDKs: their exceptions carry crossbar's hint.

Each check reads crossbar's log line for the requests it made. One line per check; the last line
is `N passed, N failed`; exits 0 only if all pass.

usage: client_test.py BIN_DIR PYTHON NPM_DIR|- ISOLATED(0|1)
"""

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = {"passed": 0, "failed": 0}


def say(text):
    print(f"client-test: {text}", flush=True)


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    say(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_line(path, needle, timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if needle in line:
                    return line.strip()
        time.sleep(0.05)
    with open(path, encoding="utf-8", errors="replace") as f:
        raise SystemExit(f"client-test: no {needle!r} in {path}:\n{f.read()}")


def blocks():
    """docs/CLIENTS.md's marked blocks: name -> text."""
    with open(os.path.join(ROOT, "docs", "CLIENTS.md"), encoding="utf-8") as f:
        text = f.read()
    found = dict(re.findall(r"<!-- client-test: ([\w-]+) -->\n```\w*\n(.*?)```", text, re.S))
    wanted = {"claude-code", "codex", "open-webui", "aider", "openai-open", "openai-keyed",
              "openai-use", "anthropic-open", "anthropic-keyed", "anthropic-use"}
    if set(found) != wanted:
        raise SystemExit(f"client-test: docs/CLIENTS.md marks {sorted(found)}, wanted {sorted(wanted)}")
    return found


class Gateway:
    """A `crossbar serve` with or without a client key, and its log."""

    def __init__(self, bin_dir, work, name, sim_url, key):
        self.name, self.key = name, key
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = os.path.join(work, f"{name}.toml")
        keys = ""
        if key:
            keys = f'[keys.laptop]\nhash = "sha256:{hashlib.sha256(key.encode()).hexdigest()}"\n'
        with open(config, "w") as f:
            f.write(f'listen = "127.0.0.1:{self.port}"\nadmin_listen = "127.0.0.1:{free_port()}"\n'
                    f'db = "{name}.db"\nhealth_interval = "1s"\n'
                    f'[hosts.titan]\nurl = "{sim_url}"\n[hosts.titan.models.qwen-coder]\n'
                    f'parallel = 2\n[routes.projA]\nhosts = ["titan"]\nmodel = "qwen-coder"\n{keys}')
        self.log = os.path.join(work, f"{name}.log")
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen([os.path.join(bin_dir, "crossbar"), "serve", "-c", config],
                                         stdout=subprocess.DEVNULL, stderr=err)
        wait_line(self.log, "host up host=titan")
        self.mark = 0

    def lines_since_mark(self):
        """Request lines logged since the last call (up to 5 ms late: the log writer batches)."""
        time.sleep(0.1)
        with open(self.log, encoding="utf-8", errors="replace") as f:
            lines = [l for l in f.read().splitlines() if " status=" in l]
        new, self.mark = lines[self.mark:], len(lines)
        return new

    def served(self, api, preflight=False):
        """Whether the requests since the mark include a 200 for `api` (with the key's name when
        keyed) and no refusal; with `preflight`, but for one answered before routing (Claude Code's
        start-up `HEAD /projA`, sent without its key: 404, or 401 with keys; issue 46 logs such
        refusals as `answered before routing`, without a row)."""
        new = self.lines_since_mark()
        want = [l for l in new if f" api={api} " in l and " status=200 " in l
                and (not self.key or " key=laptop" in l)]
        refused = [l for l in new if (" status=4" in l or " status=5" in l)
                   and not (preflight and "answered before routing" in l
                            and (" status=404 " in l or " status=401 " in l))]
        return bool(want) and not refused, "\n".join(new) or "no request reached crossbar"

    def env_key(self):
        return self.key or "none"


def substitute(text, gw):
    return text.replace("http://gateway:8080", gw.url)


def run(cmd, env=None, timeout=120, cwd=None):
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
        return done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired:
        return -1, "", f"timed out after {timeout}s"


def sdks(b, gw, python, work):
    for sdk, api in [("openai", "chat"), ("anthropic", "messages")]:
        mode = "keyed" if gw.key else "open"
        code = substitute(b[f"{sdk}-{mode}"] + "\n" + b[f"{sdk}-use"], gw)
        path = os.path.join(work, f"{sdk}-{mode}.py")
        with open(path, "w") as f:
            f.write(code)
        env = dict(os.environ, CROSSBAR_KEY=gw.env_key())
        gw.lines_since_mark()
        status, out, err = run([python, path], env=env, timeout=60)
        ok, log = gw.served(api)
        if sdk == "openai":
            ok = ok and " api=responses " in log
        check(f"{sdk} SDK, {mode}: the doc's snippet", status == 0 and out.strip() and ok,
              f"exit {status}\n{out}\n{err}\n{log}")


def mistakes(gw, python):
    """The doc's "When it goes wrong": the SDKs show crossbar's hint."""
    script = f"""
import anthropic, openai
try:
    anthropic.Anthropic(base_url="{gw.url}/projA/v1", api_key="{gw.env_key()}").messages.create(
        model="qwen-coder", max_tokens=8, messages=[{{"role": "user", "content": "hi"}}])
except anthropic.NotFoundError as e:
    print("anthropic:", e)
try:
    openai.OpenAI(base_url="{gw.url}/projA/v1", api_key="cb-not-a-key").models.list()
except openai.AuthenticationError as e:
    print("openai:", e)
"""
    status, out, err = run([python, "-c", script], timeout=60)
    check("the Anthropic SDK given /projA/v1 shows the /v1-twice hint",
          "the path has /v1 twice: use http://<gateway>/projA as the base URL" in out,
          f"{out}\n{err}")
    check("the OpenAI SDK with a wrong key shows it is not one crossbar knows",
          "not one this gateway knows" in out, f"{out}\n{err}")
    gw.lines_since_mark()


def stream(url, key, body):
    """POSTs `body`, returns the answer's status and text."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return answer.status, answer.read().decode()


def env_lines(text, gw):
    """`NAME=value` and `export NAME=value` lines, `$CROSSBAR_KEY` filled in."""
    env = {}
    for line in substitute(text, gw).splitlines():
        line = line.split("#", 1)[0].strip().removeprefix("export ").strip()
        if "=" in line:
            name, value = line.split("=", 1)
            env[name] = value.strip().strip('"').replace("$CROSSBAR_KEY", gw.env_key())
    return env


def open_webui(b, gw):
    env = env_lines(b["open-webui"], gw)
    base, key = env["OPENAI_API_BASE_URL"], env["OPENAI_API_KEY"]
    gw.lines_since_mark()
    request = urllib.request.Request(f"{base}/models", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        models = [m["id"] for m in json.load(answer)["data"]]
    status, text = stream(f"{base}/chat/completions", key, {
        "model": models[0], "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "Say hello."}]})
    ok, log = gw.served("chat")
    check(f"Open WebUI's connection, {'keyed' if gw.key else 'open'}: its requests replayed",
          status == 200 and "data: [DONE]" in text and ok and " api=other " in log,
          f"{models} {status}\n{text[-300:]}\n{log}")


def aider(b, gw):
    settings = {}
    for line in substitute(b["aider"], gw).splitlines():
        if ":" in line:
            name, value = line.split(":", 1)
            settings[name.strip()] = value.strip().replace("$CROSSBAR_KEY", gw.env_key())
    model = settings["model"].removeprefix("openai/")
    gw.lines_since_mark()
    status, text = stream(f"{settings['openai-api-base']}/chat/completions",
                          settings["openai-api-key"], {
                              "model": model, "stream": True, "temperature": 0,
                              "messages": [{"role": "system", "content": "Act as an expert coder."},
                                           {"role": "user", "content": "Say hello."}]})
    ok, log = gw.served("chat")
    check(f"aider's settings, {'keyed' if gw.key else 'open'}: its request replayed",
          status == 200 and "data: [DONE]" in text and ok, f"{status}\n{text[-300:]}\n{log}")


def codex_config(b, gw):
    text = substitute(b["codex"], gw)
    if not gw.key:
        # Without client keys the doc says to leave env_key out.
        text = "\n".join(l for l in text.splitlines() if not l.startswith("env_key"))
    return text


def codex_replay(b, gw):
    config = tomllib.loads(codex_config(b, gw))
    provider = config["model_providers"][config["model_provider"]]
    key = gw.env_key() if provider.get("env_key") else "none"
    gw.lines_since_mark()
    status, text = stream(f"{provider['base_url']}/responses", key, {
        "model": config["model"], "instructions": "You are a coding agent.", "stream": True,
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "Say hello."}]}],
        "tools": [], "tool_choice": "auto", "parallel_tool_calls": False, "store": False,
        "include": [], "prompt_cache_key": str(uuid.uuid4())})
    ok, log = gw.served("responses")
    check(f"Codex's model_providers entry, {'keyed' if gw.key else 'open'}: its request replayed",
          status == 200 and "response.completed" in text and ok, f"{status}\n{text[-300:]}\n{log}")


def codex_real(b, gw, npm, work):
    home = tempfile.mkdtemp(prefix="codex-home.", dir=work)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(codex_config(b, gw))
    env = dict(os.environ, CODEX_HOME=home, HOME=home, CROSSBAR_KEY=gw.env_key())
    codex = os.path.join(npm, "node_modules", "@openai", "codex", "bin", "codex.js")
    gw.lines_since_mark()
    status, out, err = run(["node", codex, "exec", "--skip-git-repo-check", "Say hello"],
                           env=env, cwd=home)
    ok, log = gw.served("responses")
    check(f"Codex itself, {'keyed' if gw.key else 'open'}: codex exec with the doc's config",
          status == 0 and ok, f"exit {status}\n{out[-500:]}\n{err[-1500:]}\n{log}")


def claude_real(b, gw, npm, work):
    home = tempfile.mkdtemp(prefix="claude-home.", dir=work)
    env = dict(os.environ, HOME=home, CROSSBAR_KEY=gw.env_key())
    lines = substitute(b["claude-code"], gw).splitlines()
    env.update(env_lines("\n".join(l for l in lines if l.startswith("export ")), gw))
    command = [l for l in lines if l.startswith("claude ")][0]
    claude = os.path.join(npm, "node_modules", "@anthropic-ai", "claude-code", "cli-wrapper.cjs")
    gw.lines_since_mark()
    status, out, err = run(["node", claude, "-p", command.split('"')[1]], env=env, cwd=home)
    # Its start-up `HEAD /projA` is crossbar's 404 (CLIENTS.md says so).
    ok, log = gw.served("messages", preflight=True)
    check(f"Claude Code itself, {'keyed' if gw.key else 'open'}: claude -p with the doc's variables",
          status == 0 and out.strip() and ok, f"exit {status}\n{out[-500:]}\n{err[-1500:]}\n{log}")


def main():
    bin_dir, python, npm = (os.path.abspath(a) if a != "-" else a for a in sys.argv[1:4])
    isolated = sys.argv[4] == "1"
    b = blocks()
    work = tempfile.mkdtemp(prefix="crossbar-clients.")
    children = []
    try:
        sim_out = os.path.join(work, "sim.out")
        with open(sim_out, "w") as out:
            # Claude Code asks for 32,000 tokens and takes an answer cut there for an error: the
            # sim's answers end by themselves.
            children.append(subprocess.Popen(
                [os.path.join(bin_dir, "crossbar-sim"), "--listen", "127.0.0.1:0", "--alias",
                 "qwen-coder", "--ctx", "1048576", "--slots", "2", "--eos-after", "8"],
                stdout=out, stderr=subprocess.STDOUT))
        sim_url = wait_line(sim_out, "sim listening on ").split("on ", 1)[1]
        os.chdir(work)
        gateways = [Gateway(bin_dir, work, "open", sim_url, None),
                    Gateway(bin_dir, work, "keyed", sim_url, "cb-" + secrets.token_hex(16))]
        children += [g.proc for g in gateways]
        say(f"a crossbar-sim, and crossbar without keys ({gateways[0].url}) and with one "
            f"({gateways[1].url})")
        clis = npm != "-" and isolated and shutil.which("node")
        if not clis:
            say("Claude Code and Codex not run: " + (
                "not in a network namespace of loopback only" if not isolated else
                "no NPM_DIR or no node"))
        for gw in gateways:
            sdks(b, gw, python, work)
            open_webui(b, gw)
            aider(b, gw)
            codex_replay(b, gw)
            if clis:
                codex_real(b, gw, npm, work)
                claude_real(b, gw, npm, work)
        mistakes(gateways[1], python)
    finally:
        for child in reversed(children):
            child.terminate()
            child.wait(timeout=10)
    shutil.rmtree(work, ignore_errors=True)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed", flush=True)
    sys.exit(1 if RESULTS["failed"] else 0)


if __name__ == "__main__":
    main()
