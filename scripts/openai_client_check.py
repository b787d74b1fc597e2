#!/usr/bin/env python3
"""Checks that the official `openai` Python client works against a running `rollflash serve`.

Calls `models.list`, `completions.create` (text and token-id prompts, with logprobs; `stream`
with a usage chunk, `stop` strings, `echo`, `logprobs: k` alternatives) and
`chat.completions.create` (with logprobs and `top_logprobs`; `stream`, `stop`) and validates every raw answer *strictly* against the
client's pydantic types (the client itself builds its objects without validation, so a wrong
field type would otherwise go unnoticed), then checks the values make sense. Also checks that
errors map to the client's exception classes.

    scripts/setup_openai.sh
    rollflash serve --port 30000 &
    .venv/bin/python scripts/openai_client_check.py --base-url http://127.0.0.1:30000

Exits non-zero on the first failure; the last line is "N passed, 0 failed".
"""

import argparse
import json
import math
import os
import sys

import openai
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types import CompletionChoice  # noqa: F401  (the stream's choices)

PASSED = []


def check(name, cond, detail=""):
    if not cond:
        print(f"FAILED: {name} {detail}")
        print(f"{len(PASSED)} passed, 1 failed")
        sys.exit(1)
    PASSED.append(name)
    print(f"ok: {name}")


def raw_json(raw):
    """The JSON body of a `with_raw_response` answer."""
    return json.loads(raw.http_response.text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="server root, e.g. http://127.0.0.1:30000")
    ap.add_argument("--api-key", default=os.environ.get("ROLLFLASH_API_KEY") or "EMPTY")
    args = ap.parse_args()

    root = args.base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    client = openai.OpenAI(base_url=root + "/v1", api_key=args.api_key, max_retries=0, timeout=120)
    print(f"openai {openai.__version__} against {root}")

    # models.list
    models = client.models.list()
    check("models.list returns a model", len(models.data) >= 1)
    for m in models.data:
        Model.model_validate(m.model_dump())
    model = models.data[0].id
    check("model entries validate", isinstance(model, str) and models.data[0].object == "model")

    # completions.create with a text prompt and logprobs
    raw = client.completions.with_raw_response.create(
        model=model,
        prompt="12+30=",
        max_tokens=8,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True},
    )
    Completion.model_validate(raw_json(raw))
    check("completion answer validates strictly", True)
    c = raw.parse()
    choice = c.choices[0]
    check("completion finish_reason", choice.finish_reason == "length", choice.finish_reason)
    lp = choice.logprobs
    check("completion logprobs present", lp is not None and lp.tokens is not None)
    check("one logprob per token", len(lp.tokens) == len(lp.token_logprobs) == 8, str(lp))
    check(
        "logprobs are finite and <= 0",
        all(math.isfinite(x) and x <= 0 for x in lp.token_logprobs),
        str(lp.token_logprobs),
    )
    check("text_offset per token", lp.text_offset is not None and len(lp.text_offset) == 8)
    check("completion usage", c.usage is not None and c.usage.completion_tokens == 8, str(c.usage))

    # completions.create with a token-id prompt
    raw = client.completions.with_raw_response.create(
        model=model, prompt=[2, 22, 23, 11], max_tokens=4, temperature=0, logprobs=0,
        extra_body={"ignore_eos": True},
    )
    Completion.model_validate(raw_json(raw))
    c = raw.parse()
    check("token-id prompt", c.usage.prompt_tokens == 4 and c.usage.completion_tokens == 4, str(c.usage))
    ext = raw_json(raw)["choices"][0].get("rollflash", {})
    check("rollflash extension carries ids and versions",
          len(ext.get("output_ids", [])) == 4 and len(ext.get("versions", [])) == 4, str(ext))

    # chat.completions.create with logprobs
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "hi"}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=0,
    )
    ChatCompletion.model_validate(raw_json(raw))
    check("chat answer validates strictly", True)
    cc = raw.parse()
    ch = cc.choices[0]
    check("chat message role", ch.message.role == "assistant")
    check("chat finish_reason", ch.finish_reason in ("stop", "length"), ch.finish_reason)
    content = ch.logprobs.content if ch.logprobs else None
    check("chat logprobs content", content is not None and 1 <= len(content) <= 8, str(ch.logprobs))
    check(
        "chat logprob entries",
        all(isinstance(t.token, str) and t.logprob <= 0 and t.top_logprobs == [] for t in content),
    )
    check("chat usage", cc.usage.completion_tokens == len(content), str(cc.usage))

    # stream=True on completions: chunks validate, the text equals the non-streamed one, and a
    # final usage chunk comes with stream_options.include_usage
    base = dict(model=model, prompt="12+30=", max_tokens=8, temperature=0,
                extra_body={"ignore_eos": True})
    whole = client.completions.create(**base).choices[0].text
    chunks = list(client.completions.create(**base, stream=True,
                                            stream_options={"include_usage": True}))
    # The client parses completion chunks as `Completion`, whose finish_reason may not be null:
    # OpenAI's own mid-stream chunks would fail strict validation too, so only chunks with a
    # finish reason (and the usage chunk) are validated strictly.
    for ch in chunks:
        if all(c.finish_reason is not None for c in ch.choices):
            Completion.model_validate(ch.model_dump())
    check("stream chunks validate", len(chunks) >= 2)
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    check("streamed text equals the whole", text == whole, f"{text!r} vs {whole!r}")
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    check("stream ends with a finish_reason", finishes[-1] == "length", str(finishes))
    check("usage chunk last", chunks[-1].choices == [] and chunks[-1].usage is not None
          and chunks[-1].usage.completion_tokens == 8, str(chunks[-1]))

    # stop strings: cut before the match, finish_reason "stop"
    stop_at = next((i for i in range(1, len(whole) - 1) if whole.find(whole[i:i + 2]) == i), None)
    if stop_at is not None:
        stop = whole[stop_at:stop_at + 2]
        c = client.completions.create(**base, stop=[stop])
        check("stop string cuts before the match",
              c.choices[0].text == whole[:stop_at] and c.choices[0].finish_reason == "stop",
              f"{c.choices[0].text!r} / {stop!r} / {whole!r}")
        streamed = "".join(ch.choices[0].text
                           for ch in client.completions.create(**base, stop=stop, stream=True)
                           if ch.choices)
        check("streamed stop string", streamed == whole[:stop_at], f"{streamed!r}")

    # echo with logprobs: the prompt first, its first token's log-prob null
    c = client.completions.create(model=model, prompt="12+30=", max_tokens=2, temperature=0,
                                  echo=True, logprobs=1, extra_body={"ignore_eos": True})
    lp = c.choices[0].logprobs
    check("echo prepends the prompt", c.choices[0].text.startswith("12+30="), c.choices[0].text)
    check("echo log-probs cover the prompt",
          len(lp.tokens) == c.usage.prompt_tokens + 2 and lp.token_logprobs[0] is None, str(lp))

    # logprobs: k lists alternatives (greedy: the best is the sampled token)
    c = client.completions.create(**base, logprobs=3)
    lp = c.choices[0].logprobs
    check("logprobs=3 lists three alternatives",
          all(len(t) == 3 for t in lp.top_logprobs), str(lp.top_logprobs))
    check("greedy samples the best alternative",
          all(abs(max(t.values()) - x) < 1e-4 for t, x in zip(lp.top_logprobs, lp.token_logprobs)))

    # chat: top_logprobs alternatives, stream (role first, usage last), stop
    msgs = [{"role": "user", "content": "hi"}]
    cc = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                        logprobs=True, top_logprobs=2,
                                        extra_body={"ignore_eos": True})
    content = cc.choices[0].logprobs.content
    check("chat top_logprobs lists two", all(len(t.top_logprobs) == 2 for t in content))
    check("chat greedy token is the best", all(t.top_logprobs[0].token == t.token for t in content))
    whole_chat = cc.choices[0].message.content
    chunks = list(client.chat.completions.create(model=model, messages=msgs, max_tokens=6,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    for ch in chunks:
        ChatCompletionChunk.model_validate(ch.model_dump())
    check("chat stream opens with the role", chunks[0].choices[0].delta.role == "assistant")
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    check("chat streamed content equals the whole", streamed == whole_chat,
          f"{streamed!r} vs {whole_chat!r}")
    check("chat usage chunk last", chunks[-1].choices == [] and chunks[-1].usage is not None)
    if len(whole_chat) > 2:
        stop = whole_chat[1]
        cc = client.chat.completions.create(model=model, messages=msgs, max_tokens=6,
                                            temperature=0, stop=stop,
                                            extra_body={"ignore_eos": True})
        check("chat stop string", stop not in cc.choices[0].message.content
              and cc.choices[0].finish_reason == "stop", str(cc.choices[0]))

    # errors map to the client's exceptions
    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        check("unknown model is refused", False)
    except openai.NotFoundError as e:
        check("unknown model -> NotFoundError", "no-such-model" in str(e), str(e))
    try:
        client.completions.create(model=model, prompt="x", max_tokens=1, temperature=-1)
        check("negative temperature is refused", False)
    except openai.BadRequestError as e:
        check("bad parameter -> BadRequestError", "temperature" in str(e), str(e))
    if args.api_key != "EMPTY":
        bad = openai.OpenAI(base_url=root + "/v1", api_key=args.api_key + "x", max_retries=0)
        try:
            bad.models.list()
            check("a wrong API key is refused", False)
        except openai.AuthenticationError:
            check("wrong API key -> AuthenticationError", True)

    print(f"{len(PASSED)} passed, 0 failed")


if __name__ == "__main__":
    main()
