"""Drives `deltafin serve` with the official openai SDK; called by tests/serve_openai.sh.

argv: BINARY MODEL_DIR. Exits non-zero (an AssertionError) on the first failed check.
"""
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Literal

import openai
import pydantic

BIN, MODEL = sys.argv[1], sys.argv[2]
KEY = "test-key"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


PORT = free_port()
BASE = f"http://127.0.0.1:{PORT}"
server = subprocess.Popen(
    [BIN, "serve", "-m", MODEL, "--port", str(PORT), "--api-key", KEY, "--temp", "0",
     "-t", "1", "--ctx-size", "4096", "--queue", "16", "-n", "64"],
    stderr=subprocess.PIPE, text=True)


def get(path, key=KEY):
    req = urllib.request.Request(BASE + path)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode()


try:
    for _ in range(300):
        try:
            if get("/health", None)[0] == 200:
                break
        except OSError:
            time.sleep(0.1)
    else:
        raise AssertionError("the server did not start: " + server.stderr.read())

    c = openai.OpenAI(base_url=BASE + "/v1", api_key=KEY, max_retries=0, timeout=60)
    MODEL_ID = c.models.list().data[0].id
    assert MODEL_ID == "qwen3_moe", MODEL_ID
    msgs = [{"role": "user", "content": "Hello"}]

    # chat, whole and streamed with usage: the same greedy text
    r = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=12)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length"), r
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    chunks = list(c.chat.completions.create(
        model=MODEL_ID, messages=msgs, max_tokens=12, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text, (streamed, text)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    # the same prompt again: its KV cache is reused
    r2 = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=12)
    assert r2.usage.prompt_tokens_details.cached_tokens == r2.usage.prompt_tokens - 1, r2.usage
    assert r2.choices[0].message.content == text

    # completions, stop
    comp = c.completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=10)
    full = comp.choices[0].text
    assert comp.object == "text_completion" and len(full) > 0
    stop = full[2:5]
    if stop.strip():
        cut = c.completions.create(model=MODEL_ID, prompt="The sky is", max_tokens=10, stop=[stop])
        assert cut.choices[0].text == full[:full.index(stop)], (cut.choices[0].text, full, stop)
        assert cut.choices[0].finish_reason == "stop"

    # seeds: sampled output repeats with the same seed
    def sampled(seed):
        return c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=16,
                                         temperature=1.0, top_p=1.0, seed=seed).choices[0].message.content
    assert sampled(7) == sampled(7)

    # a tool-using request renders (the tiny model does not call tools; the in-process tests
    # check tool-call parsing)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    t = c.chat.completions.create(model=MODEL_ID, messages=msgs, tools=tools, max_tokens=8)
    assert t.usage.prompt_tokens > r.usage.prompt_tokens

    # content as a list of text parts (as LangChain and Open WebUI send it): the same answer
    # as the parts joined with a space; a developer message is a system message
    parts = c.chat.completions.create(model=MODEL_ID, max_tokens=12, messages=[
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Hello"},
                                     {"type": "text", "text": "there"}]}])
    joined = c.chat.completions.create(model=MODEL_ID, max_tokens=12, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}])
    assert parts.choices[0].message.content == joined.choices[0].message.content
    assert parts.usage.prompt_tokens == joined.usage.prompt_tokens
    # any model name is answered by the one model, which the answer names
    assert c.chat.completions.create(model="nope", messages=msgs, max_tokens=2).model == MODEL_ID

    # errors surface as the SDK's exception types
    # n > 1: one choice per consecutive seed, indexed
    two = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=4, n=2, seed=3,
                                    temperature=0.9)
    assert [ch.index for ch in two.choices] == [0, 1], two
    for kwargs, exc in [({"n": 50}, openai.BadRequestError),
                        ({"logit_bias": {"99999": 5}}, openai.BadRequestError),
                        ({"extra_body": {"grammar": "root ::= \"a"}}, openai.BadRequestError),
                        ({"messages": [{"role": "user", "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]},
                         openai.BadRequestError),
                        ({"response_format": {"type": "xml"}}, openai.BadRequestError)]:
        args = {"model": MODEL_ID, "messages": msgs, "max_tokens": 4, **kwargs}
        try:
            c.chat.completions.create(**args)
            raise AssertionError(f"{kwargs} was accepted")
        except exc:
            pass
    try:
        openai.OpenAI(base_url=BASE + "/v1", api_key="wrong", max_retries=0).models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass

    # structured output through the SDK's parse(): the pydantic model's JSON schema is
    # enforced, so even the random-weight fixture answers with an instance of it
    class Pet(pydantic.BaseModel):
        kind: Literal["cat", "dog"]
        legs: int = pydantic.Field(ge=0, le=8)

    class Person(pydantic.BaseModel):
        name: str = pydantic.Field(max_length=6)
        happy: bool
        pet: Pet

    parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
    parsed = parse(model=MODEL_ID, messages=msgs, max_tokens=600, response_format=Person)
    person = parsed.choices[0].message.parsed
    assert isinstance(person, Person) and parsed.choices[0].finish_reason == "stop", parsed
    assert Person.model_validate_json(parsed.choices[0].message.content) == person
    # json_object and logit_bias pass through the SDK too
    obj = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=8,
                                    response_format={"type": "json_object"})
    assert obj.choices[0].message.content.startswith("{"), obj

    # concurrent streams, decoded together by the default's 4 slots sharing the whole
    # context (no --parallel, as llama-server): each ends with its finish_reason and the
    # whole text the same prompt gets alone
    props = json.loads(get("/props")[1])
    assert (props["total_slots"], props["default_generation_settings"]["n_ctx"]) == (4, 4096), props
    stream_prompts = [f"Tell me about {w}" for w in ("cats", "dogs", "ships", "rain")]
    whole = {p: c.chat.completions.create(model=MODEL_ID, max_tokens=24, messages=[
        {"role": "user", "content": p}]).choices[0].message.content for p in stream_prompts}
    got, errors = {}, []

    def streamer(p):
        try:
            parts, finish = [], None
            for ch in c.chat.completions.create(model=MODEL_ID, max_tokens=24, stream=True,
                                                messages=[{"role": "user", "content": p}]):
                if ch.choices:
                    parts.append(ch.choices[0].delta.content or "")
                    finish = ch.choices[0].finish_reason or finish
            got.setdefault(p, []).append(("".join(parts), finish))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=streamer, args=(p,)) for p in stream_prompts * 2]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    for p in stream_prompts:
        assert len(got[p]) == 2, (p, got[p])
        for streamed_text, finish in got[p]:
            assert streamed_text == whole[p] and finish in ("stop", "length"), (p, streamed_text, finish)

    # load: 8 clients x 5 requests, every greedy answer equal to the request alone
    prompts = [f"Question number {i}" for i in range(5)]
    alone = {p: c.chat.completions.create(model=MODEL_ID, max_tokens=16, messages=[
        {"role": "user", "content": p}]).choices[0].message.content for p in prompts}
    results, errors = [], []

    def client(k):
        try:
            for i in range(5):
                p = prompts[(k + i) % 5]
                a = c.chat.completions.create(model=MODEL_ID, max_tokens=16, messages=[
                    {"role": "user", "content": p}]).choices[0].message.content
                results.append((p, a))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors, errors
    assert len(results) == 40, len(results)
    assert all(alone[p] == a for p, a in results), [x for x in results if alone[x[0]] != x[1]]

    # a client that disconnects mid-stream cancels its generation
    conn = http.client.HTTPConnection("127.0.0.1", PORT, timeout=10)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 4000, "stream": True}),
        {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
    resp = conn.getresponse()
    assert resp.status == 200
    resp.fp.readline()
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    for _ in range(100):
        m = get("/metrics")[1]
        if "deltafin_cancelled_total 1" in m and "deltafin_in_flight 0" in m:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("no cancellation in /metrics:\n" + m)
    assert get("/health", None)[0] == 200
    last = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=12).choices[0].message.content
    assert last == text, (last, text)
    print("serve_openai: all checks passed")
except BaseException:
    # the server's side of a failure: its log (and, if it died, its exit status)
    died = server.poll()
    if died is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(5)
    except subprocess.TimeoutExpired:
        server.kill()
    print(f"server exit status {died} before the SIGTERM, {server.returncode} after; its stderr:\n{server.stderr.read()}", file=sys.stderr)
    raise
finally:
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(5)
    except subprocess.TimeoutExpired:
        server.kill()
        raise AssertionError("the server did not exit within 5 s of SIGTERM")
assert rc == 0, (rc, server.stderr.read())
