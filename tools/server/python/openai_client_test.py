"""The official openai Python package, unchanged, against a running `lgpt serve`.

    python3 openai_client_test.py PORT API_KEY

A completion, a chat completion, a streamed chat completion (equal to the whole one), the
model list, logprobs (greedy tokens are the top ones; streamed equal whole), n choices (seeded:
equal to separate requests), penalties and logit_bias, a list of prompts, and the client's own
error classes for 404, 400 (with `param`) and 401; structured outputs (a JSON schema),
a forced tool call (whole and streamed, the deltas accumulated as clients do), embeddings
(float and base64). Prints one line per check and exits 1 on
any failure.
"""

import base64
import json
import struct
import sys
import traceback

import openai


def main(port, api_key):
    base_url = f"http://127.0.0.1:{port}/v1"
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=60.0)
    state = {}
    checks = []

    def check(function):
        checks.append(function)
        return function

    @check
    def models_list():
        models = client.models.list()
        assert len(models.data) == 1, models.data
        state["model"] = models.data[0].id
        assert state["model"], "empty model id"

    @check
    def completions_create():
        completion = client.completions.create(
            model=state["model"], prompt="And God said", max_tokens=20, temperature=0)
        assert completion.object == "text_completion", completion.object
        assert completion.choices[0].text, "empty completion"
        assert completion.choices[0].finish_reason in ("stop", "length")
        usage = completion.usage
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, usage

    @check
    def chat_completions_create():
        chat = client.chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "And God said"}],
            max_tokens=24, temperature=0)
        assert chat.object == "chat.completion", chat.object
        assert chat.choices[0].message.role == "assistant"
        state["chat_text"] = chat.choices[0].message.content
        assert state["chat_text"], "empty chat reply"

    @check
    def chat_completions_create_stream():
        stream = client.chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "And God said"}],
            max_tokens=24, temperature=0, stream=True,
            stream_options={"include_usage": True})
        text, chunks, finish, usage = "", 0, None, None
        for chunk in stream:
            chunks += 1
            if chunk.usage:
                usage = chunk.usage
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            text += choice.delta.content or ""
            if choice.finish_reason:
                finish = choice.finish_reason
        assert text == state["chat_text"], (text, state["chat_text"])
        assert chunks > 3, f"only {chunks} chunks"
        assert finish in ("stop", "length"), finish
        assert usage is not None and usage.completion_tokens > 0, usage

    @check
    def unknown_model_is_not_found_error():
        try:
            client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
        except openai.NotFoundError as error:
            assert error.status_code == 404, error.status_code
            assert "gpt-4" in error.message, error.message
            return
        raise AssertionError("no NotFoundError")

    @check
    def chat_logprobs_of_greedy_tokens_are_the_top_ones():
        chat = client.chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "And God said"}],
            max_tokens=12, temperature=0, logprobs=True, top_logprobs=3)
        content = chat.choices[0].logprobs.content
        assert len(content) == chat.usage.completion_tokens, (len(content), chat.usage)
        for entry in content:
            assert len(entry.top_logprobs) == 3, entry
            assert entry.top_logprobs[0].token == entry.token, entry
            assert abs(entry.top_logprobs[0].logprob - entry.logprob) < 1e-9, entry
            assert entry.logprob <= 0, entry
            assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token, entry
        stream = client.chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "And God said"}],
            max_tokens=12, temperature=0, logprobs=True, top_logprobs=3, stream=True)
        streamed = []
        for chunk in stream:
            if chunk.choices and chunk.choices[0].logprobs:
                streamed += chunk.choices[0].logprobs.content or []
        assert [e.token for e in streamed] == [e.token for e in content], (streamed, content)
        for a, b in zip(streamed, content):
            assert abs(a.logprob - b.logprob) < 1e-6, (a, b)

    @check
    def completion_logprobs_have_openais_shape():
        completion = client.completions.create(
            model=state["model"], prompt="And God said", max_tokens=8, temperature=0, logprobs=2)
        logprobs = completion.choices[0].logprobs
        assert len(logprobs.tokens) == completion.usage.completion_tokens, logprobs
        assert len(logprobs.token_logprobs) == len(logprobs.tokens)
        assert len(logprobs.top_logprobs) == len(logprobs.tokens)
        assert all(len(top) <= 2 for top in logprobs.top_logprobs), logprobs.top_logprobs
        assert logprobs.text_offset == sorted(logprobs.text_offset), logprobs.text_offset

    @check
    def n_choices_equal_separate_seeded_requests():
        def ask(n, seed):
            return client.completions.create(
                model=state["model"], prompt="And God said", max_tokens=10, temperature=1.0,
                n=n, seed=seed)
        together = ask(3, 1000)
        assert [c.index for c in together.choices] == [0, 1, 2], together.choices
        for i, choice in enumerate(together.choices):
            alone = ask(1, 1000 + i).choices[0].text
            assert choice.text == alone, (i, choice.text, alone)
        assert together.usage.completion_tokens == 30, together.usage
        chat = client.chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "x"}], n=2,
            max_tokens=4, seed=3)
        assert [c.index for c in chat.choices] == [0, 1], chat.choices
        texts = {}
        for chunk in client.chat.completions.create(
                model=state["model"], messages=[{"role": "user", "content": "x"}], n=2,
                max_tokens=4, seed=3, stream=True):
            for choice in chunk.choices:
                texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        assert texts == {c.index: c.message.content for c in chat.choices}, (texts, chat.choices)

    @check
    def penalties_and_logit_bias_are_honoured():
        def ask(extra=None, **fields):
            return client.completions.create(
                model=state["model"], prompt="And God said", max_tokens=6, temperature=0,
                logprobs=0, extra_body={"return_tokens_as_token_ids": True, **(extra or {})},
                **fields)
        plain = ask()
        first = plain.choices[0].logprobs.tokens[0]
        assert first.startswith("token_id:"), first
        banned = ask(logit_bias={first[len("token_id:"):]: -100})
        assert banned.choices[0].logprobs.tokens[0] != first, banned
        penalised = ask(frequency_penalty=1.5, presence_penalty=0.5,
                        extra={"repetition_penalty": 1.2, "min_p": 0.01})
        assert penalised.usage.completion_tokens == 6, penalised.usage

    @check
    def a_list_of_prompts_has_a_choice_each():
        completion = client.completions.create(
            model=state["model"], prompt=["And God said", "In the beginning"], max_tokens=5,
            temperature=0, n=2)
        assert [c.index for c in completion.choices] == [0, 1, 2, 3], completion.choices
        assert completion.choices[0].text == completion.choices[1].text  # greedy, same prompt
        single = client.completions.create(
            model=state["model"], prompt="In the beginning", max_tokens=5, temperature=0)
        assert completion.choices[2].text == single.choices[0].text

    @check
    def structured_output_validates():
        schema = {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 10},
            "count": {"type": "integer", "minimum": 1, "maximum": 9}},
            "required": ["name", "count"], "additionalProperties": False}
        for seed in range(3):
            chat = client.chat.completions.create(
                model=state["model"], messages=[{"role": "user", "content": "x"}],
                max_tokens=80, seed=seed, response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "thing", "schema": schema, "strict": True}})
            value = json.loads(chat.choices[0].message.content)
            assert set(value) == {"name", "count"}, value
            assert isinstance(value["name"], str) and len(value["name"]) <= 10, value
            assert isinstance(value["count"], int) and 1 <= value["count"] <= 9, value

    @check
    def forced_tool_call_parses():
        tools = [{"type": "function", "function": {
            "name": "lookup", "description": "Find a verse",
            "parameters": {"type": "object", "properties": {
                "book": {"enum": ["Genesis", "Exodus"]},
                "chapter": {"type": "integer", "minimum": 1, "maximum": 50}},
                "required": ["book", "chapter"]}}}]
        chat = client.chat.completions.create(
            model=state["model"], messages=[{"role": "user", "content": "Find it."}],
            max_tokens=80, seed=5, tools=tools,
            tool_choice={"type": "function", "function": {"name": "lookup"}})
        choice = chat.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        call = choice.message.tool_calls[0]
        assert call.function.name == "lookup", call
        arguments = json.loads(call.function.arguments)
        assert arguments["book"] in ("Genesis", "Exodus"), arguments
        assert 1 <= arguments["chapter"] <= 50, arguments

    @check
    def streamed_tool_call_accumulates():
        tools = [{"type": "function", "function": {
            "name": "lookup", "parameters": {"type": "object", "properties": {
                "chapter": {"type": "integer", "minimum": 1, "maximum": 50}},
                "required": ["chapter"]}}}]
        request = dict(model=state["model"], messages=[{"role": "user", "content": "Find it."}],
                       max_tokens=80, seed=7, tools=tools,
                       tool_choice={"type": "function", "function": {"name": "lookup"}})
        whole = client.chat.completions.create(**request).choices[0].message.tool_calls[0]
        calls, finish = {}, None
        for chunk in client.chat.completions.create(stream=True, **request):
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = delta.id or call["id"]
                if delta.function.name:
                    call["name"] += delta.function.name
                call["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
        assert finish == "tool_calls", finish
        assert list(calls) == [0], calls
        assert calls[0]["id"].startswith("call_"), calls
        assert calls[0]["name"] == "lookup", calls
        assert calls[0]["arguments"] == whole.function.arguments, (calls, whole)
        assert 1 <= json.loads(calls[0]["arguments"])["chapter"] <= 50, calls

    @check
    def embeddings_have_unit_length():
        result = client.embeddings.create(model=state["model"], input=["In the beginning", "Amen"])
        assert [d.index for d in result.data] == [0, 1], result.data
        for item in result.data:
            norm = sum(x * x for x in item.embedding) ** 0.5
            assert abs(norm - 1) < 1e-4, norm
        assert len(result.data[0].embedding) == len(result.data[1].embedding)
        encoded = client.embeddings.create(model=state["model"], input="Amen",
                                           encoding_format="base64")
        values = struct.unpack(f"<{len(result.data[1].embedding)}f",
                               base64.b64decode(encoded.data[0].embedding))
        assert all(abs(a - b) < 1e-6 for a, b in zip(values, result.data[1].embedding))

    @check
    def bad_value_is_bad_request_naming_the_param():
        try:
            client.chat.completions.create(
                model=state["model"], messages=[{"role": "user", "content": "x"}], n=0)
        except openai.BadRequestError as error:
            assert error.param == "n", error.param
            return
        raise AssertionError("no BadRequestError")

    @check
    def wrong_api_key_is_authentication_error():
        wrong = openai.OpenAI(base_url=base_url, api_key=api_key + "x", max_retries=0)
        try:
            wrong.models.list()
        except openai.AuthenticationError as error:
            assert error.status_code == 401, error.status_code
            return
        raise AssertionError("no AuthenticationError")

    passed = failed = 0
    for function in checks:
        try:
            function()
            passed += 1
            print(f"ok {function.__name__}")
        except Exception:  # Every failure is reported, then the next check runs.
            failed += 1
            print(f"FAIL {function.__name__}: {traceback.format_exc()}")
    print(f"{passed} passed, {failed} failed (openai {openai.__version__})")
    return 0 if failed == 0 and passed == len(checks) else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: openai_client_test.py PORT API_KEY")
    sys.exit(main(sys.argv[1], sys.argv[2]))
