#!/usr/bin/env python3
"""What the stash saves on one llama-server, with no crossbar in between (docs/BENCHMARKS.md, "The
stash"). Sends N conversations that share a long system prompt, 6 turns each, to /completion in
turn; with `stash`, sends crossbar's stash body (upstream/side.rs) before every returning turn.
Prints each turn's prompt_n and, last, the total prefilled and the stashes' own tokens, and the
mean time of a stash. Start the server fresh for each run (its RAM cache keeps the last run's
prompts), on loopback:

  ../shared/llama/start.sh -c 32768 -np 2 PORT -- --cache-ram 38 -sps 0
  scripts/stash-effect.py http://127.0.0.1:PORT none|stash CONVERSATIONS
"""
import json
import random
import sys
import time
import urllib.request

STASH = {"prompt": "crossbar: keep every idle slot in the RAM prompt cache, then answer nothing.",
         "n_predict": 0, "cache_prompt": True}


def post(url, body):
    request = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())


def main():
    url, mode, conversations = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = random.Random(1)
    vocabulary = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()

    def words(n):
        return " ".join(rng.choice(vocabulary) for _ in range(n))

    family = "SYSTEM " + words(1500)
    prompts = [family + f" conversation {i} " + words(300) for i in range(conversations)]
    total = stash_tokens = 0
    stash_s = []
    for turn in range(6):
        for i in range(conversations):
            if mode == "stash" and turn > 0:
                started = time.monotonic()
                stash_tokens += post(url, STASH)["timings"]["prompt_n"]
                stash_s.append(time.monotonic() - started)
            answer = post(url, {"prompt": prompts[i], "n_predict": 24, "temperature": 0,
                                "cache_prompt": True})
            total += answer["timings"]["prompt_n"]
            print(f"turn {turn} conversation {i} prompt_n {answer['timings']['prompt_n']}")
            prompts[i] += answer["content"] + " USER " + words(150)
    mean = sum(stash_s) / len(stash_s) * 1e3 if stash_s else 0.0
    print(f"prefilled {total} stash_tokens {stash_tokens} stashes {len(stash_s)} "
          f"stash_mean_ms {mean:.1f}")


if __name__ == "__main__":
    main()
