"""The official openai Python package, unchanged, against a running `lgpt serve`.

    python3 openai_client_test.py PORT API_KEY

A completion, a chat completion, a streamed chat completion (equal to the whole one), the
model list, and the client's own error classes for 404, 400 (with `param`) and 401. Prints one
line per check and exits 1 on any failure.
"""

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
    def unsupported_n_is_bad_request_naming_the_param():
        try:
            client.chat.completions.create(
                model=state["model"], messages=[{"role": "user", "content": "x"}], n=2)
        except openai.BadRequestError as error:
            assert "not supported" in error.message, error.message
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
