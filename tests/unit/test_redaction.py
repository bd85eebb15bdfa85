"""What counts as a credential in text: memories, stored teams and lessons refuse it, the audit redacts it."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from masterplanner import Settings
from masterplanner.redaction import (
    REMOVED,
    looks_secret,
    redacted,
    redacted_content,
    secret_parts,
    secret_refusal,
    shortened,
    without_cut_secret,
)

CREDENTIALS = [
    "sk-abcdefghijklmnop1234",
    "use api_key=sk-live-ABCDEFGHIJKLMNOP1234 to fetch it",
    "sk_live_51HbC2eF3gH4iJ5kL6mN7oP8",
    "sk-proj-Abc123def456ghi789jkl",
    "ghp_0123456789abcdefghijABCDEFGHIJ",
    "github_pat_11ABCDEFG0123456789_abcdefghij",
    "xoxb-1234567890-abcdef",
    "AKIAIOSFODNN7EXAMPLE",
    "AIzaSyA-1234567890abcdefghijklmnopqrstu",
    "password: hunter22",
    "Authorization: Bearer abcdefghijklmnop1234",
    "-----BEGIN RSA PRIVATE KEY-----",
    # .env and export forms: a name ending in a credential word
    "OPENAI_API_KEY=abcd1234efgh5678",
    "DB_PASSWORD=hunter2hunter2",
    "GITHUB_TOKEN=abcdef123456xyz",
    "MY_API_KEY: abcdef1234567",
    "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMIK7MDENG",
    "X-Api-Key: abcdef1234567",
    "api_key=abcdef123456",
    "password: correcthorsebatterystaple",
    'password = "hunter2hunter2"',
    "API_KEY=ABCDEF1234567890XYZ",
]
# words that begin like a key prefix: before, a team whose task held one was not stored
WORDS = [
    "Write a skill-building workshop plan",
    "a sky-blue-themed landing page",
    "skip_if_not_installed",
    "a ghost-writer-style memoir",
    "PKCS1_OAEP_padding",
    "a risk-assessment-framework",
    "the password is strong",
    "count tokens: 123456 in total",
    "the token_count=123456",
    "password_hint: the usual one",
    # a requirement named like a credential: a value with no digit, shorter than 12
    "Make a signup form; password: minimum 12 characters",
    "Explain the difference: token: bucket algorithms",
    "secret: unknown",
    # code and placeholders: references to a secret, not one
    "Add a settings field api_key = os.environ['OPENAI_API_KEY'] to config.py",
    "Write a tokenizer: token = text.split() in python",
    "password=${DB_PASSWORD} in docker-compose.yml",
    "api_key: YOUR_API_KEY_HERE placeholder",
    "token=abc123 in a test fixture",
    "api_key=os.getenv('OPENAI_API_KEY')",
]


@pytest.mark.parametrize("text", CREDENTIALS)
def test_credentials_are_found_and_taken_out(text: str) -> None:
    assert looks_secret(text)
    assert not looks_secret(redacted(text)) and REMOVED in redacted(text)


@pytest.mark.parametrize("text", WORDS)
def test_words_that_begin_like_a_key_are_not_credentials(text: str) -> None:
    assert (looks_secret(text), redacted(text)) == (False, text)


def test_a_long_run_of_name_parts_is_no_credential() -> None:
    """`(?:[A-Za-z0-9]+[_-])*` once tried the name from every part: 16 KB of `a_` took 8 s. How
    long it takes is bench/redaction.py's to measure ("name parts"); here, what comes out."""
    assert redacted("a_" * 8000) == "a_" * 8000 and not looks_secret("x-" * 8000)


def test_what_a_person_types_holds_a_secret_by_its_shape_or_as_a_secret_variables_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WEATHER_TOKEN", "plainvalue123")
    assert secret_parts("call it with plainvalue123 please") == ["plainvalue123"]
    assert secret_parts("OPENAI_API_KEY=abcd1234efgh5678") == ["OPENAI_API_KEY=abcd1234efgh5678"]
    assert [secret_parts(text) for text in WORDS] == [[] for _ in WORDS]
    refusal = secret_refusal("the task", not_in="the task")
    assert refusal == (
        "the task holds what looks like a secret (an API key, a token or a password, such as "
        "`OPENAI_API_KEY=…`): put secrets in the environment or the settings file, not in the task"
    )


def test_a_private_key_is_taken_out_whole_not_only_its_first_line() -> None:
    body = "MIIEowIBAAKCAQEA1x2y3z4\nQWERTYUIOPasdfghjkl0987"
    key = f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----"
    assert redacted(f"the key:\n{key}\nand after it") == f"the key:\n{REMOVED}\nand after it"
    # cut before its END line (a preview of 500 characters): taken out to the end
    assert redacted(f"the key:\n{key[:60]}") == f"the key:\n{REMOVED}"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a URL's password goes; its user name, host and path stay readable
        (
            "Client error '401 Unauthorized' for url 'http://alice:s3cretpass@127.0.0.1:9/search?q=x'",
            f"Client error '401 Unauthorized' for url 'http://alice:{REMOVED}@127.0.0.1:9/search?q=x'",
        ),
        ("redis://:pw@cache:6379/0", f"redis://:{REMOVED}@cache:6379/0"),
        # a password holding `@`, `/` or `?` unescaped goes whole, to the URL's last `@`
        (
            "postgresql+psycopg://u:p@ss/w?rd@db.example/runs",
            f"postgresql+psycopg://u:{REMOVED}@db.example/runs",
        ),
        # a credential-named query parameter's value, however short, goes; its name stays
        ("https://api.example/v1?q=tides&api_key=abc", f"https://api.example/v1?q=tides&api_key={REMOVED}"),
        ("https://maps.example/geo?key=plain&lang=en", f"https://maps.example/geo?key={REMOVED}&lang=en"),
        ("http://h/db?password=secret123", f"http://h/db?password={REMOVED}"),
        ("wss://h/stream?access_token=t0k#top", f"wss://h/stream?access_token={REMOVED}#top"),
        ("GET /feed?TOKEN=x1&page=2", f"GET /feed?TOKEN={REMOVED}&page=2"),
    ],
)
def test_a_url_loses_its_password_and_credential_parameters_and_keeps_the_rest(text: str, shown: str) -> None:
    assert redacted(text) == shown
    assert not looks_secret(shown)


@pytest.mark.parametrize(
    "text",
    [
        # a port before a later `@` is no password (it took the path out, and refused the task)
        "Sign up bob at http://localhost:8080/subscribe?email=bob@example.com",
        "https://registry.npmjs.org:443/@types/node",
        "http://localhost:3000/@alice",
        "http://[::1]:8080/@me",
        # parameters that are no credential, or whose value is none
        "Page through https://api.example.com/items?page_token=2 and list every item",
        "sort with ?sort_key=date&partition_key=user_id&auth=none",
        "the docs say ?key=value and ?token=abc",
        "for(i=0;key=next(it);i++) a=1;token=abc",
        # code and placeholders
        "f'https://api.example.com/data?api_key={api_key}&q={city}'",
        'curl "https://api.example.com/v1/items?token=$TOKEN"',
        "https://maps.example/geo?key=YOUR_API_KEY_HERE",
        "https://user:{password}@host/x",
    ],
)
def test_what_a_person_types_about_urls_is_no_secret_unless_it_holds_one(text: str) -> None:
    """What a person types is refused on narrower shapes than what is taken out of what is shown."""
    assert (looks_secret(text), secret_parts(text)) == (False, [])
    assert redacted(text) == text or REMOVED in redacted(text)  # shown: hiding more costs little


@pytest.mark.parametrize(
    "text",
    [
        "fetch http://alice:s3cretpass@127.0.0.1:9/search",
        "pull from https://oauth2:" + "eyJhbGciOi" * 40 + "@registry.example.com/v2/",
        "call https://api.example/v1?api_key=abcd1234efgh&q=x",
        "open https://maps.example/geo?key=AIzaSyD-plain1234&lang=en",
    ],
)
def test_a_url_holding_a_credential_is_refused_when_typed(text: str) -> None:
    assert looks_secret(text)
    assert "s3cretpass" not in redacted(text) and "abcd1234efgh" not in redacted(text)
    assert "eyJhbGciOi" not in redacted(text)


@pytest.mark.parametrize(
    "text",
    [
        "https://example.org/search?q=key&sort=keyword",
        "mailto:alice@example.org",
        "ssh git@github.com:owner/repo.git",
        "http://alice@example.org/no-password",
        "https://example.org/a?monkey=1&turkey=2",
    ],
)
def test_urls_without_a_credential_are_left_as_they_are(text: str) -> None:
    assert (looks_secret(text), redacted(text)) == (False, text)


def test_text_full_of_url_starts_is_left_as_it_is() -> None:
    """The password runs to the last `@` of its token: unbounded, `x://u:` repeated took seconds
    (bench/redaction.py's "url starts" measures it); here, what comes out."""
    for text in ("x://u:" * 3000, "x://" * 4000, "a-" * 8000, "?" + "a_" * 8000):
        assert redacted(text) == text


def test_secrets_the_settings_hold_are_taken_out_and_refused_while_those_settings_are_in_use(
    isolated: Path,
) -> None:
    """None of these has a credential's shape where an error may quote it: each was shown before."""
    settings = Settings(
        database_url="postgresql://planner:p%40ss-w0rd@db.example/runs?sslpassword=Ssl9pass",
        searxng_url="http://alice:searchpass7@search.example",
        otel_endpoint="https://collector.example/v1?token=plainwordsvalue",
        mcp_servers={
            "gh": {
                "command": "npx",
                "args": ["--api-key", "flagvalue42", "--verbose"],
                "env": {"GH_TOKEN": "postgres"},
            },
            "remote": {"url": "https://bob:remotepass1@mcp.example/mcp", "env": {"LOG_LEVEL": "debugging"}},
        },
    )
    quoted = "p@ss-w0rd p%40ss-w0rd Ssl9pass searchpass7 plainwordsvalue flagvalue42 remotepass1"
    assert redacted(quoted) == " ".join([REMOVED] * 7)
    assert secret_parts(f"use {quoted}") == sorted(quoted.split(), key=lambda value: (-len(value), value))
    # an MCP server's variable not named as a secret is none; one that could be a word ("postgres")
    # is taken out where it stands alone, and a person may still type it
    assert redacted("debugging postgres at postgresql://x") == f"debugging {REMOVED} at postgresql://x"
    assert secret_parts("debugging postgres") == []
    del settings
    gc.collect()  # settings no longer in use: their values are text like any other
    assert redacted("plainwordsvalue postgres") == "plainwordsvalue postgres"


def test_the_trace_exporter_s_header_values_are_secrets_in_logs_and_what_a_person_types(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`OTEL_EXPORTER_OTLP_HEADERS` carries a collector's credentials (`Authorization=Bearer%20…`):
    before, its values, named as headers and of no key's shape, were shown where a log line or an
    error quoted them, and a task holding one was taken."""
    import logging

    from masterplanner.logs import REDACTING

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Basic%20dXNlcjpwYXNz,x-team=teamvalue7")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", " api-key = tracesvalue8 ")
    quoted = "sent dXNlcjpwYXNz (Basic dXNlcjpwYXNz, Basic%20dXNlcjpwYXNz) to teamvalue7 and tracesvalue8"
    record = logging.LogRecord("opentelemetry", logging.WARNING, __file__, 1, "%s", (quoted,), None)
    assert REDACTING.filter(record)
    assert record.getMessage() == f"sent {REMOVED} ({REMOVED}, {REMOVED}) to {REMOVED} and {REMOVED}"
    assert secret_parts("a task naming teamvalue7") == ["teamvalue7"]
    assert redacted("Authorization=Basic") == "Authorization=Basic"  # a word of it shorter than 8 is none


def test_the_trace_exporter_s_headers_that_name_things_are_no_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every header's value was taken for a secret: with `x-honeycomb-dataset=masterplanner`, the word
    went from every log line and code line (`import [secret removed].redaction`), and a task naming it
    was refused."""
    monkeypatch.setenv(
        "OTEL_EXPORTER_OTLP_HEADERS", "x-honeycomb-team=hcabc123xyz456,x-honeycomb-dataset=masterplanner"
    )
    assert redacted_content("import masterplanner.redaction") == "import masterplanner.redaction"
    assert secret_parts("Fix the masterplanner CLI") == []
    assert redacted("team key hcabc123xyz456") == f"team key {REMOVED}"


def test_a_configuration_file_s_credentials_go_from_what_a_tool_read_and_its_code_stays() -> None:
    """A `.env`, ini, YAML or shell file read by a step: before, an unquoted value of no key's shape
    (`DB_PASSWORD=hunter2hunter2`) reached the model whole; only a quoted one went. A line of code
    that names a variable is still code (`api_key = settings.api_key`)."""
    read = "\n".join(
        [
            "API_KEY=sk-live-abc123XYZ",
            "DB_PASSWORD=hunter2hunter2",
            "DB_PASS=correcthorsebatterystaple  # the old one",
            "export GITHUB_TOKEN=abcdef123456xyz",
            "[database]",
            "password = hunter2hunter2",
            "services:",
            "  - secret: s3cr3t-v4lue",
            "    basic_auth: alice:pa55w0rd",
            "DB_HOST=db.example.org",
            "api_key = settings.api_key_for_tests",
            "password = hashed_password",
            "    token=settings.token_for_tests,",
            "token = get_token(1234567890)",
            "API_KEY=${API_KEY}",
            "API_KEY=YOUR_API_KEY_HERE",
            "sort_by: created_at",
            "key: user_2024_profile",
            "KEY=PROJ-12345678",
            "KEY=abcd1234efgh5678ijkl9012",
        ]
    )
    assert redacted_content(read).split("\n") == [
        f"API_KEY={REMOVED}",
        f"DB_PASSWORD={REMOVED}",
        f"DB_PASS={REMOVED}  # the old one",
        f"export GITHUB_TOKEN={REMOVED}",
        "[database]",
        f"password = {REMOVED}",
        "services:",
        f"  - secret: {REMOVED}",
        f"    basic_auth: {REMOVED}",
        "DB_HOST=db.example.org",
        "api_key = settings.api_key_for_tests",
        "password = hashed_password",
        "    token=settings.token_for_tests,",
        "token = get_token(1234567890)",
        "API_KEY=${API_KEY}",
        "API_KEY=YOUR_API_KEY_HERE",
        "sort_by: created_at",
        "key: user_2024_profile",  # a bare `key` names an identifier unless its value looks random
        "KEY=PROJ-12345678",
        f"KEY={REMOVED}",
    ]
    # what is shown (`redacted`) takes out at least as much
    shown = redacted(read)
    assert "hunter2" not in shown and "s3cr3t" not in shown and "pa55w0rd" not in shown


def test_a_cut_never_leaves_part_of_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut inside a secret, its start had no key's shape and was no held value: it was shown."""
    monkeypatch.setenv("OPENAI_API_KEY", "plainvalue0123456789zq")
    said = "the key is plainvalue0123456789zq, the password: hunter2hunter2 and "
    text = f"{said}ghp_0123456789abcdefghijABCDEFGHIJ."
    # a cut inside a secret is made where it begins (a name given it stays); one outside is as asked
    assert shortened(text, 16) == "the key is "
    assert shortened(text, 40) == "the key is plainvalue0123456789zq, the "
    assert shortened(text, 60) == "the key is plainvalue0123456789zq, the "
    assert shortened(text, 76) == shortened(text, 70) == said
    assert shortened("see https://bob:pa55word99@host/x", 20) == "see https://bob:"
    assert shortened(text, 38) == text[:38]
    assert shortened(text, len(text)) == text
    # text cut where what followed is not known: its last word goes, and an end that begins a held
    # secret (one of spaces, too)
    monkeypatch.setenv("DB_PASSWORD", "correct horse battery staple")
    assert without_cut_secret("exit code 0\nDB_PASSWORD=hunt") == "exit code 0\n"
    assert without_cut_secret("the password is correct horse ba") == "the password is "
    assert without_cut_secret("nothing secret here") == "nothing secret "
    assert without_cut_secret("the key is plainvalu") == "the key is "


def test_a_json_member_named_as_a_credential_loses_its_string_value_and_the_json_stays_valid() -> None:
    """A file or a page holding `{"password": "hunter2hunter2", "api_key": "abcd1234efgh"}`: before,
    the name's quote before the `:` hid it from every rule, and the model, the events and the
    database were given both values whole. A name of the `.env` rule's (ending in a credential word
    as a part of its own, or in camelCase) whose string value looks like one loses the value; a
    number, a boolean, null, a short word or an identifier (`"key": "created_at"`) stays."""
    import json

    read = json.dumps(
        {
            "password": "hunter2hunter2",
            "api_key": "abcd1234efgh",
            "accessToken": "ya29.a0AfH6SMBx7",
            "refresh_token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl",
            "client_secret": "GOCSPX-1a2b3c4d5e6f",
            "db": {"credentials": "alice:pa55w0rd", "DB_PASS": 'quo"te5678'},
            "key": "f3a9c2e1d4b5a7c8e9f0a1b2",
            "Key": "photos/2024/cat.jpg",
            "issue": {"key": "PROJ-1234", "fields": {"key": "f3a9c2e1d4b5"}},
            "token_count": 12,
            "max_tokens": 4096,
            "password_set": True,
            "auth": None,
            "token": "short",
            "key_name": "created_at",
            "sortKey": "created_at",
            "translation_key": "settings.title",
            "secret": "YOUR_SECRET_HERE",
            "apiKey": "${API_KEY}",
            "monkey": "banana12345678",
            "note": "password: minimum 12 characters",
        },
        indent=2,
    )
    shown = json.loads(redacted_content(read))
    assert shown == {
        "password": REMOVED,
        "api_key": REMOVED,
        "accessToken": REMOVED,
        "refresh_token": REMOVED,
        "client_secret": REMOVED,
        "db": {"credentials": REMOVED, "DB_PASS": REMOVED},
        "key": REMOVED,
        "Key": "photos/2024/cat.jpg",
        "issue": {"key": "PROJ-1234", "fields": {"key": "f3a9c2e1d4b5"}},
        "token_count": 12,
        "max_tokens": 4096,
        "password_set": True,
        "auth": None,
        "token": "short",
        "key_name": "created_at",
        "sortKey": "created_at",
        "translation_key": "settings.title",
        "secret": "YOUR_SECRET_HERE",
        "apiKey": "${API_KEY}",
        "monkey": "banana12345678",
        "note": "password: minimum 12 characters",
    }
    # on one line, as a reply or an error quotes it, and as Python shows a dict (`str(result)`)
    line = '{"password":"hunter2hunter2","api_key":"abcd1234efgh","n":1}'
    assert redacted(line) == f'{{"password":"{REMOVED}","api_key":"{REMOVED}","n":1}}'
    assert redacted_content(line) == redacted(line)
    assert redacted_content("{'password': 'hunter2hunter2'}") == f"{{'password': '{REMOVED}'}}"
    # cut inside the value, a preview keeps the name and nothing of the value
    assert shortened('{"password": "hunter2hunter2"}', 20) == '{"password": "'


def test_code_manifests_paths_and_messages_named_like_a_credential_are_left_as_they_are() -> None:
    """What a step reads and may write back: each line was taken for a credential's setting, and the
    marker went into the person's file in its value's place. A value is code when it names a variable
    (`config.apiKey;`, `next_page_token2`) or a path."""
    kept = [
        # C-family code: a name, a `;` or `,` after it
        "this.apiKey = config.apiKey;",
        "password = user.password;",
        "this.credentials = credentials;",
        "this.password = hashedPassword;",
        "token = next_page_token2",
        "api_key = settings.v2_api_key,",
        # manifests: a bare `key` naming a label, a secret's entry or a cache
        "  - key: node-role.kubernetes.io/control-plane",
        "            key: database-password",
        "key: cache-v1-linux-deps",
        "key = cache_key_v2",
        # paths, as a shell's `env` prints them
        "SSH_KEY=~/.ssh/id_ed25519",
        "PWD=/home/user/projects",
        "OLDPWD=/Users/alice/src",
        "auth_file: ./certs/client.pem",
    ]
    assert redacted_content("\n".join(kept)) == "\n".join(kept)
    # a value with a key's mix stays a credential, however it is set
    secret = [
        ("password = hunter2hunter2;", f"password = {REMOVED}"),
        ("token = s3cr3t_v4lue", f"token = {REMOVED}"),
        ("access_token: ya29.a0AfH6SMBx7", f"access_token: {REMOVED}"),
        ("password: summer2024", f"password: {REMOVED}"),
        ("password: my_pass_2024", f"password: {REMOVED}"),
        ("AWS_SECRET_KEY=/wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", f"AWS_SECRET_KEY={REMOVED}"),
        ("DB_PASSWORD=correct-horse-battery", f"DB_PASSWORD={REMOVED}"),  # a shell's: any value
        ("error.password=Invalid-passw0rd-given", f"error.password={REMOVED}"),
        # words joined by `-` are no name in code: a passphrase goes (and a `.properties` message)
        ("password: correct-horse-battery-staple", f"password: {REMOVED}"),
        ("db_password = a-long-pass-phrase", f"db_password = {REMOVED}"),
        ("error.password=Invalid-password-given", f"error.password={REMOVED}"),
        # a bare `key` given a base64 key (a `/` in it): upper, lower and digits all three
        ("key: wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", f"key: {REMOVED}"),
        ("KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", f"KEY={REMOVED}"),
    ]
    assert redacted_content("\n".join(line for line, _ in secret)) == "\n".join(shown for _, shown in secret)


def test_a_quoted_value_loses_its_value_and_keeps_its_name_and_quotes() -> None:
    """`.env` values quoted, under names ending in pass, pwd, auth, key or credentials, were left
    whole in what a tool read and in what is shown; a quoted `DB_PASSWORD="…"` went whole, name and
    quotes too, so a file written back lost its line."""
    read = [
        'DB_PASS="correcthorse123"',
        'DB_PWD="s3cr3tpass"',
        "export AUTH='abc123def456'",
        'basic_auth: "alice:pa55w0rd"',
        'SSH_KEY="k3yk3yk3yk3y"',
        'MY_CREDENTIALS="user:pa55w0rd1"',
        'DB_PASSWORD="xhunter2hunter2"  # rotated',
        "password = 'hunter2hunter2'",
        'this.auth = "abc123def456";',
        '    client(password="hunter2hunter2", retries=3)',
    ]
    removed = [
        f'DB_PASS="{REMOVED}"',
        f'DB_PWD="{REMOVED}"',
        f"export AUTH='{REMOVED}'",
        f'basic_auth: "{REMOVED}"',
        f'SSH_KEY="{REMOVED}"',
        f'MY_CREDENTIALS="{REMOVED}"',
        f'DB_PASSWORD="{REMOVED}"  # rotated',
        f"password = '{REMOVED}'",
        f'this.auth = "{REMOVED}";',
        f'    client(password="{REMOVED}", retries=3)',
    ]
    assert redacted_content("\n".join(read)).split("\n") == removed
    shown = redacted("\n".join(read))
    for value in ("correcthorse", "s3cr3t", "abc123", "pa55w0rd", "k3yk3y", "hunter2"):
        assert value not in shown
    # a call's argument, read as code by the rule for what is shown, was shown whole
    assert redacted('client(password="hunter2hunter2")') == f'client(password="{REMOVED}")'
    # a quoted name, placeholder or short word is no credential
    kept = [
        'auth_key = "created_at"',
        'DB_PASS="${DB_PASS}"',
        "API_KEY='YOUR_API_KEY_HERE'",
        'token = "short"',
    ]
    assert redacted_content("\n".join(kept)) == "\n".join(kept)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a header line, as a request's dump or curl -v shows it: the name and scheme stay
        ("Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==", f"Authorization: Basic {REMOVED}"),
        ("proxy-authorization: basic YWxpY2U6czNjcmV0cGFzcw==", f"proxy-authorization: basic {REMOVED}"),
        (
            'curl -H "Authorization: Basic dXNlcjpwYXNz" https://h/',
            f'curl -H "Authorization: Basic {REMOVED}" https://h/',
        ),
        ("Authorization: Token 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b", f"Authorization: Token {REMOVED}"),
        # JSON, and a Python dict as `str(headers)` shows it: still JSON, or still a dict
        ('{"Authorization": "Basic dXNlcjpwYXNzd29yZDEyMw=="}', f'{{"Authorization": "Basic {REMOVED}"}}'),
        ("{'Proxy-Authorization': 'Basic dXNlcjpwYXNz'}", f"{{'Proxy-Authorization': 'Basic {REMOVED}'}}"),
    ],
)
def test_an_authorization_header_loses_its_credentials_and_keeps_its_name_and_scheme(
    text: str, shown: str
) -> None:
    """Before, only a Bearer token of 16 or more characters went: a Basic header's base64
    `user:password` reached the model, the events and the database whole, and a task holding one
    was taken."""
    assert (redacted(text), redacted_content(text)) == (shown, shown)
    assert looks_secret(text) and secret_parts(shown) == []


@pytest.mark.parametrize(
    "text",
    [
        # prose, code and placeholders about the header: no credential in them
        "Authorization: Basic authentication is not enough here",
        "Send Authorization: Basic with the user's name and password",
        "Write a Basic JavaScript tutorial",
        'headers["Authorization"] = "Basic " + encoded',
        'headers = {"Authorization": f"Basic {encoded}"}',
        "curl -H 'Authorization: Basic $CREDENTIALS' https://h/",
        "Authorization: Basic <base64 of user:password>",
        "Authorization: Basic YOUR_BASE64_HERE",
        "Authorization: required",
        "Authorization=Basic",
    ],
)
def test_what_is_said_about_an_authorization_header_is_no_credential(text: str) -> None:
    assert (looks_secret(text), redacted(text), redacted_content(text)) == (False, text, text)


def test_a_credential_name_with_a_word_after_the_credential_word_still_names_a_credential(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`secret_key_base` (Rails), `token_value`, `password_b64`: the word after the credential's
    said how it is written, and its value reached the model whole. A word naming something else
    (`_id`, `_hash`, `_count`, `_name`, `_file`) is no credential, nor a `key_value`."""
    key = "0f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c"
    read = "\n".join(
        [
            f"SECRET_KEY_BASE={key}",
            f"export RAILS_SECRET_KEY_BASE={key}",
            f"  secret_key_base: {key}",
            f"token_value = {key}",
            "PASSWORD_B64=aHVudGVyMmh1bnRlcjI=",
            f'{{"secret_key_base": "{key}", "api_key_hex": "{key}"}}',
            "passphrase: sunny2024meadow",
            # not credentials
            "aws_access_key_id: AKID0123EXAMPLE",
            "password_hash: pbkdf2_sha256_600000",
            "token_count: 1234567890",
            "secret_name: prod-db-2024-rotation",
            "key_value: cache_v2_2024",
            '{"api_key_id": "kid_2024_0001", "token_type": "refresh_2024"}',
        ]
    )
    assert redacted_content(read).split("\n") == [
        f"SECRET_KEY_BASE={REMOVED}",
        f"export RAILS_SECRET_KEY_BASE={REMOVED}",
        f"  secret_key_base: {REMOVED}",
        f"token_value = {REMOVED}",
        f"PASSWORD_B64={REMOVED}",
        f'{{"secret_key_base": "{REMOVED}", "api_key_hex": "{REMOVED}"}}',
        f"passphrase: {REMOVED}",
        "aws_access_key_id: AKID0123EXAMPLE",
        "password_hash: pbkdf2_sha256_600000",
        "token_count: 1234567890",
        "secret_name: prod-db-2024-rotation",
        "key_value: cache_v2_2024",
        '{"api_key_id": "kid_2024_0001", "token_type": "refresh_2024"}',
    ]
    assert looks_secret(f"deploy with SECRET_KEY_BASE={key}")
    assert not looks_secret("set aws_access_key_id: AKID0123EXAMPLE and token_count: 1234567890")
    # a variable so named holds a secret by its name, as `SECRET_KEY` does
    monkeypatch.setenv("SECRET_KEY_BASE", "plainbasevalue")
    monkeypatch.setenv("DEPLOY_KEY_ID", "plainidvalue")
    assert redacted("plainbasevalue plainidvalue") == f"{REMOVED} plainidvalue"


@pytest.mark.parametrize(
    "task",
    [
        'Call the API with {"password": "hunter2hunter2"}',
        "Log in with {'api_key': 'abcd1234efgh5678'}",
        'Use {"user": "bob", "password": "correct horse battery staple"}',
        'Send {"pin": 1234, "password": 48291377}',
        'Send {"api_key": ["abcd1234efgh5678", "ijkl9012mnop3456"]}',
        '{"Authorization": "Basic dXNlcjpwYXNzd29yZDEyMw=="}',
    ],
)
def test_a_task_typed_as_json_holding_a_credential_is_refused_naming_the_task(task: str) -> None:
    """A JSON member's quote before the `:` hid it from the typed check: the task was stored and
    sent to the planner with the password in it."""
    from masterplanner import PlanError
    from masterplanner.plan import validate_task

    assert looks_secret(task) and secret_parts(task) != []
    with pytest.raises(PlanError) as refused:
        validate_task(task)
    assert refused.value.problems == [secret_refusal("the task", not_in="the task")]


@pytest.mark.parametrize(
    "task",
    [
        'Return {"password": "", "token_count": 12, "max_tokens": 4096}',
        'Validate {"password": "must be at least 8 characters"}',
        'Errors look like {"password": ["can\'t be blank", "is too short"]}',
        'Paginate with {"next_token": "created_at_desc_order", "pin": 482913}',
        'Configure {"password": {"min_length": 12}}',
        'Add a French translation for {"forgot_password": "Forgot your password?"}',
        'Translate {"password": "Enter your password", "reset_password": "Send reset link"}',
    ],
)
def test_a_task_typed_as_json_about_credentials_is_taken(task: str) -> None:
    from masterplanner.plan import validate_task

    assert (looks_secret(task), secret_parts(task), validate_task(task)) == (False, [], task)


def test_a_json_member_s_passphrase_number_or_list_under_a_credential_name_goes() -> None:
    """A multi-word password, a number under `password`, `passphrase` or `secret`, and the strings
    of a list under any credential name reached the model whole: only a one-word string went. The
    JSON stays JSON (a number taken out is a string), and what is not a credential stays: a
    message (`"password": ["can't be blank"]`), a count, a `pin` (a GPIO pin's number as often
    as a code)."""
    import json

    read = json.dumps(
        {
            "password": "correct horse battery staple",
            "db": {"passphrase": "Tr0ub4dor &3 horse"},
            "secret": 8472910366,
            "admin_password": 482913,
            "api_key": ["abcd1234efgh5678", "short", "ijkl9012mnop3456"],
            "tokens_used": [12, 40],
            "errors": {"password": ["can't be blank", "must be at least 8 characters"]},
            "hint": {"password": "is too short (minimum is 8 characters)"},
            "policy": {"password": 12, "secret": 3.14159265},
            "pin": 482913,
            "token_count": 12345678,
            "max_tokens": 4096,
            "scopes": ["read_all_repositories_2024"],
        },
        indent=2,
    )
    shown = json.loads(redacted_content(read))
    assert shown == {
        "password": REMOVED,
        "db": {"passphrase": REMOVED},
        "secret": REMOVED,
        "admin_password": REMOVED,
        "api_key": [REMOVED, "short", REMOVED],
        "tokens_used": [12, 40],
        "errors": {"password": ["can't be blank", "must be at least 8 characters"]},
        "hint": {"password": "is too short (minimum is 8 characters)"},
        "policy": {"password": 12, "secret": 3.14159265},
        "pin": 482913,
        "token_count": 12345678,
        "max_tokens": 4096,
        "scopes": ["read_all_repositories_2024"],
    }
    assert json.loads(redacted(read)) == shown
    # on one line, and as Python shows a dict
    assert redacted("{'password': 48291377, 'n': 1}") == f"{{'password': '{REMOVED}', 'n': 1}}"
    assert redacted('{"secret":["s3cr3t-v4lue-1"]}') == f'{{"secret":["{REMOVED}"]}}'


def test_a_quoted_identifier_under_a_token_or_secret_name_stays_and_a_quoted_secret_goes() -> None:
    """`sort_token: "created_at_desc_order"` lost its value in a file a step wrote back: under
    names ending in token, secret or key, a quoted value was taken whole however it looked. Lower-case
    words joined by `_` or `.` are a name there; under a password's name they may be a passphrase."""
    kept = [
        'sort_token: "created_at_desc_order"',
        "    page_token = 'next_page.cursor_field'",
        'cache_key = "user_profile_v_latest"',
        'client_secret: "change_me_in_production"',
        'fetch(next_token="created_at_desc_order")',
    ]
    assert redacted_content("\n".join(kept)) == "\n".join(kept)
    gone = [
        ('password = "correct_horse_battery_staple"', f'password = "{REMOVED}"'),
        ('sort_token: "s3cr3t_t0ken_value"', f'sort_token: "{REMOVED}"'),
        ('client_secret = "mysupersecretvalue"', f'client_secret = "{REMOVED}"'),
        ('api_key = "AbCdEfGhIjKlMnOpQrSt"', f'api_key = "{REMOVED}"'),
        ('connect(token="abcd1234efgh5678")', f'connect(token="{REMOVED}")'),
    ]
    assert redacted_content("\n".join(text for text, _ in gone)) == "\n".join(shown for _, shown in gone)


@pytest.mark.parametrize(
    "text",
    [
        # a UI's strings and a framework's messages under a password's or a secret's name: words,
        # but a sentence's or a label's, not a passphrase
        '{"forgot_password": "Forgot your password?"}',
        '{"password": "Enter your password"}',
        '{"confirm_password": "Confirm new password"}',
        '"reset_password": "Send reset link"',
        '{"client_secret": "Your client secret"}',
        '{"secret": "See the docs at v2"}',
        '{"password": ["The two password fields didn\u2019t match."]}',
        '{"password": "This field is required."}',
        '{"password": "Passwords do not match!"}',
        "{'password': 'Please enter the new password'}",
    ],
)
def test_a_ui_string_or_message_under_a_password_or_secret_name_is_no_passphrase(text: str) -> None:
    """4f966b7 took any 3 to 8 words of 3 or more characters, or words with one mixing letters and
    digits (`v2`), under any name ending in password or secret for a passphrase: a step that read
    a translation file and wrote it back lost its strings, and a task holding one was refused."""
    assert (redacted(text), redacted_content(text), looks_secret(text), secret_parts(text)) == (
        text,
        text,
        False,
        [],
    )


def test_a_passphrase_under_a_password_s_own_name_still_goes_and_clearly_one_is_refused() -> None:
    """What is shown loses words that may be a passphrase under a bare `password`, `passwd` or
    `passphrase` (3 to 8 words, or words with a letter-digit-letter one); what a person types is
    refused only for one that is clearly a passphrase: 4 to 8 words of letters, no sentence."""
    gone = [
        ('{"password": "correct horse battery staple"}', f'{{"password": "{REMOVED}"}}'),
        ('{"passwd": "purple monkey dishwasher"}', f'{{"passwd": "{REMOVED}"}}'),
        ("{'passphrase': 'Tr0ub4dor &3 horse'}", f"{{'passphrase': '{REMOVED}'}}"),
        ('{"password": ["Correct Horse Battery Staple"]}', f'{{"password": ["{REMOVED}"]}}'),
    ]
    for text, shown in gone:
        assert (redacted(text), redacted_content(text)) == (shown, shown)
    assert looks_secret('Log in with {"password": "correct horse battery staple"}')
    assert looks_secret('{"passphrase": "Correct Horse Battery Staple"}')
    assert looks_secret('{"password": ["lunar basket origami velvet"]}')
    # three words, or a word mixing letters and digits among them: not clearly a passphrase typed
    assert not looks_secret('{"passwd": "purple monkey dishwasher"}')
    assert not looks_secret("{'passphrase': 'Tr0ub4dor &3 horse'}")
    # under a longer name or a secret's, words are a UI's text (a one-word key still goes)
    kept = '{"db_password": "correct horse battery staple", "secret": "lunar basket origami velvet"}'
    assert (redacted(kept), looks_secret(kept)) == (kept, False)
    assert redacted('{"db_password": "hunter2hunter2"}') == f'{{"db_password": "{REMOVED}"}}'


@pytest.mark.parametrize(
    "text",
    [
        # code naming the header's value: an identifier, not a credential
        "headers: { Authorization: authToken, Accept: 'application/json' },",
        "fetch(url, { headers: { Authorization: accessToken, Accept: 'json' } })",
        "const headers = { Authorization: this.apiToken };",
        "    Authorization: authHeader,",
        # a placeholder, as the docs write one
        "Authorization: Basic base64encoded",
        "Authorization: Basic <base64encoded>",
        "Authorization: Token your_token",
        # a signed request's header built in code: the scheme and the parameter's name stay
        "headers = {'Authorization': 'AWS4-HMAC-SHA256 Credential=' + access_key + '/' + scope}",
        'headers = {"Authorization": f"Digest username=\\"{user}\\", response=\\"{digest}\\""}',
        'header = \'Authorization: Digest username="%s", response="%s"\' % (user, digest)',
        'Authorization: Digest username="Mufasa", response="$RESPONSE"',
        'Authorization: OAuth oauth_consumer_key="key", oauth_signature="<signature>"',
        "Authorization: AWS4-HMAC-SHA256 Credential=KEY/SCOPE, SignedHeaders=host, Signature=YOUR_SIGNATURE",
    ],
)
def test_code_and_placeholders_for_an_authorization_header_stay(text: str) -> None:
    """4f966b7 took any word with a lower-case letter before an upper-case one for a header's
    credentials: a JavaScript file a step read and wrote back lost its variables' names."""
    assert (redacted(text), redacted_content(text), looks_secret(text)) == (text, text, False)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a bare credential with no scheme goes when it looks random
        (
            "Authorization: 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b",
            f"Authorization: {REMOVED}",
        ),
        ('{"Authorization": "dXNlcjpwYXNzd29yZA"}', f'{{"Authorization": "{REMOVED}"}}'),
        ("Authorization: Bearer accessTokenValue", f"Authorization: Bearer {REMOVED}"),
        # a scheme with parameters: the secret-bearing parameter's value goes, the rest stays
        (
            'Authorization: Digest username="Mufasa", realm="testrealm@host.com", '
            'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth, nc=00000001, '
            'response="6629fae49393a05397450978507c4ef1", opaque="5ccc069c403ebaf9f0171e9517f40e41"',
            'Authorization: Digest username="Mufasa", realm="testrealm@host.com", '
            'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", uri="/dir/index.html", qop=auth, nc=00000001, '
            f'response="{REMOVED}", opaque="5ccc069c403ebaf9f0171e9517f40e41"',
        ),
        (
            'Authorization: OAuth oauth_consumer_key="xvz1evFS4wEEPTGEFPHBog", '
            'oauth_nonce="kYjzVBB8Y0ZFabxSWbWovY3uYSQ2pTgmZeNu2VS4cg", '
            'oauth_signature="tnnArxj06cWHq44gCs1OSKk%2FjY%3D", oauth_signature_method="HMAC-SHA1"',
            'Authorization: OAuth oauth_consumer_key="xvz1evFS4wEEPTGEFPHBog", '
            'oauth_nonce="kYjzVBB8Y0ZFabxSWbWovY3uYSQ2pTgmZeNu2VS4cg", '
            f'oauth_signature="{REMOVED}", oauth_signature_method="HMAC-SHA1"',
        ),
        (
            "Authorization: AWS4-HMAC-SHA256 "
            "Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;range;x-amz-date, "
            "Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",
            "Authorization: AWS4-HMAC-SHA256 "
            f"Credential={REMOVED}/20130524/us-east-1/s3/aws4_request, "
            f"SignedHeaders=host;range;x-amz-date, Signature={REMOVED}",
        ),
        # as JSON holds it, quotes escaped
        (
            '{"Authorization": "Digest username=\\"Mufasa\\", '
            'response=\\"6629fae49393a05397450978507c4ef1\\""}',
            f'{{"Authorization": "Digest username=\\"Mufasa\\", response=\\"{REMOVED}\\""}}',
        ),
    ],
)
def test_an_authorization_header_loses_only_its_credentials_or_its_signature(text: str, shown: str) -> None:
    """A scheme with parameters was cut at its first parameter's name (`Digest [secret
    removed]"Mufasa"`, the signature shown) or lost its scheme's name (`[secret removed]
    Credential=…`): a parameter's `name=` is no credential."""
    assert (redacted(text), redacted_content(text)) == (shown, shown)
    assert looks_secret(text) and secret_parts(shown) == []


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a bare credential followed by another field, as a log line or key=value (logfmt) log writes it
        (
            "Authorization: 9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b status=200",
            f"Authorization: {REMOVED} status=200",
        ),
        (
            "authorization=9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b user=bob",
            f"authorization={REMOVED} user=bob",
        ),
        (
            "ts=2026-01-01T00:00:00Z level=debug authorization=9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b "
            "url=https://x.example/a",
            f"ts=2026-01-01T00:00:00Z level=debug authorization={REMOVED} url=https://x.example/a",
        ),
        # a scheme with parameters is still read as one: its credential parameter's key id and
        # signature go, its name and the other parameters stay
        (
            "Authorization: HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524, "
            "Signature=fe5f80f77d5fa3beca038a248ff027d0445342fe2855ddc963176630326f1024",
            f"Authorization: HMAC-SHA256 Credential={REMOVED}/20130524, Signature={REMOVED}",
        ),
    ],
)
def test_a_bare_authorization_credential_before_another_field_goes(text: str, shown: str) -> None:
    """A value with no scheme followed by ` name=` was taken for a scheme (as `AWS4-HMAC-SHA256
    Credential=…` is one): a logfmt line's token was shown and a task holding it was taken."""
    assert (redacted(text), redacted_content(text)) == (shown, shown)
    assert looks_secret(text) and secret_parts(shown) == []


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # words with a letter-digit-letter word, or a letters-then-digits one, are a passphrase
        # whatever punctuation or word is among them
        ('{"password": "Tr0ub4dor &3 horse!"}', f'{{"password": "{REMOVED}"}}'),
        ('{"password": "c0rrect h0rse, battery"}', f'{{"password": "{REMOVED}"}}'),
        ('{"password": "Your2Secret horse"}', f'{{"password": "{REMOVED}"}}'),
        ('{"password": "Winter2024 is cold"}', f'{{"password": "{REMOVED}"}}'),
        ("{'passphrase': 'the Summer99 sky'}", f"{{'passphrase': '{REMOVED}'}}"),
    ],
)
def test_a_passphrase_holding_a_word_with_digits_goes_even_if_it_reads_as_a_sentence(
    text: str, shown: str
) -> None:
    """The sentence-or-label reading (a trailing `!`, a `,`, "your", "the") was applied to
    passphrases with digits too, and a letters-then-digits word (`Winter2024`) made none: these
    were shown, where they were taken out before."""
    assert (redacted(text), redacted_content(text)) == (shown, shown)


@pytest.mark.parametrize(
    "text",
    [
        # a UI's text with digits under a password's own name: no letter-digit word in it
        '{"password": "Must be 8+ characters."}',
        '{"password": "Use at least 8 characters"}',
        '{"password": "Enter your password"}',
        # a letter and a digit alone (a version) are no passphrase's word
        '{"password": "See the docs at v2"}',
    ],
)
def test_a_ui_string_with_digits_under_a_password_s_name_stays(text: str) -> None:
    assert (redacted(text), redacted_content(text), looks_secret(text)) == (text, text, False)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # a JSON string holding JSON: the header's quotes escaped
        (
            '"{\\"Authorization\\": \\"Basic dXNlcjpwYXNzd29yZA==\\"}"',
            f'"{{\\"Authorization\\": \\"Basic {REMOVED}\\"}}"',
        ),
        # curl's -u user:password: the user stays, the password goes
        ("curl -u admin:correcthorse https://x.example/", f"curl -u admin:{REMOVED} https://x.example/"),
        (
            "curl -s --user 'deploy:S3cretPass99' https://x.example/",
            f"curl -s --user 'deploy:{REMOVED}' https://x.example/",
        ),
        (
            "curl -X POST \\\n  -u admin:hunter2hunter2 \\\n  https://h/",
            f"curl -X POST \\\n  -u admin:{REMOVED} \\\n  https://h/",
        ),
    ],
)
def test_an_escaped_authorization_header_and_curl_s_user_password_go(text: str, shown: str) -> None:
    assert (redacted(text), redacted_content(text)) == (shown, shown)
    assert looks_secret(text) and secret_parts(shown) == []


@pytest.mark.parametrize(
    "text",
    [
        "curl -u $USER:$PASS https://x.example/",
        'curl -u "$API_USER:$API_PASSWORD" https://x.example/',
        "curl -u user https://x.example/",
        "curl -u admin: https://x.example/",
        # not curl's: a user and a group
        "docker run -u 1000:1000 image",
    ],
)
def test_curl_s_user_alone_or_as_variables_and_other_commands_user_stay(text: str) -> None:
    assert (redacted(text), redacted_content(text), looks_secret(text)) == (text, text, False)


@pytest.mark.parametrize(
    ("text", "shown", "content"),
    [
        # a list under a plural credential name: each string that looks random or has a key's own
        # shape goes, the rest (a tokenizer's pieces, a name) stays, and the JSON stays JSON
        (
            '{"tokens": ["ghp_0123456789abcdefghijABCDEFGHIJ", "s3cr3tT0kenValue99", "Hello", '
            '"internationalization"]}',
            f'{{"tokens": ["{REMOVED}", "{REMOVED}", "Hello", "internationalization"]}}',
            None,
        ),
        (
            '{"api_keys": ["abcd1234efgh5678", "ijkl9012mnop3456"], "n": 2}',
            f'{{"api_keys": ["{REMOVED}", "{REMOVED}"], "n": 2}}',
            None,
        ),
        ("{'accessTokens': ['ya29.a0AfH6SMBx7']}", f"{{'accessTokens': ['{REMOVED}']}}", None),
        # unquoted, as YAML's flow sequence: a string in its place, the YAML still YAML
        ("passwords: [hunter2hunter2, s3cr3tpass]", f'passwords: ["{REMOVED}", "{REMOVED}"]', None),
        ("api_keys = ['abcd1234efgh5678', \"short\"]", f"api_keys = ['{REMOVED}', \"short\"]", None),
        # a camelCase name with a word after the credential's that says how it is written
        ("secretKeyBase: 0f4e5d6c7b8a9f0e1d2c3b4a5f6e7d8c", REMOVED, f"secretKeyBase: {REMOVED}"),
        ('{"apiKeyValue": "abcd1234efgh5678"}', f'{{"apiKeyValue": "{REMOVED}"}}', None),
        ('apiKeyValue = "abcd1234efgh5678"', REMOVED, f'apiKeyValue = "{REMOVED}"'),
        ("clientSecretB64: aHVudGVyMmh1bnRlcjI=", REMOVED, f"clientSecretB64: {REMOVED}"),
        ('{"clientSecretB64": "aHVudGVyMmh1bnRlcjI="}', f'{{"clientSecretB64": "{REMOVED}"}}', None),
        # an unquoted passphrase on a YAML or ini line of its own, under a password's own name
        ("password: correct horse battery staple", f"password: {REMOVED}", None),
        ("  - passphrase: purple monkey dishwasher # old", f"  - passphrase: {REMOVED} # old", None),
        # Azure's SharedKey and SharedKeyLite: the account stays, the signature goes
        (
            "Authorization: SharedKey myaccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08=",
            f"Authorization: SharedKey myaccount:{REMOVED}",
            None,
        ),
        (
            '{"Authorization": "SharedKeyLite myaccount:ctzMq410TV3wS7upTBcunJTDLEJwMAZuFPfr0mrrA08="}',
            f'{{"Authorization": "SharedKeyLite myaccount:{REMOVED}"}}',
            None,
        ),
        # AWS signature v2: the key id goes by its own shape, the signature too
        (
            "Authorization: AWS AKIAIOSFODNN7EXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg=",
            f"Authorization: AWS {REMOVED}:{REMOVED}",
            None,
        ),
        # Hawk: its id and its mac go, its timestamp and nonce stay
        (
            'Authorization: Hawk id="dh37fgj492je", ts="1353832234", nonce="j4h3g2", '
            'mac="6R4rV5iE+NPoym+WwjeHzjAGXUtLNIxmo1vpMofpLAE="',
            f'Authorization: Hawk id="{REMOVED}", ts="1353832234", nonce="j4h3g2", mac="{REMOVED}"',
            None,
        ),
    ],
)
def test_plural_camel_case_passphrase_and_signed_header_credentials_go(
    text: str, shown: str, content: str | None
) -> None:
    """Each was shown whole (docs/security.md listed them as known gaps): a plural name, a camelCase
    name with a word after the credential's, an unquoted passphrase, and the `Authorization`
    schemes whose credentials hold a `:` (SharedKey, AWS v2) or are parameters other than a
    signature (Hawk's `id` and `mac`)."""
    assert (redacted(text), redacted_content(text)) == (shown, content or shown)
    assert secret_parts(shown) == [] and secret_parts(content or shown) == []


@pytest.mark.parametrize(
    "text",
    [
        # counts and names under plural or credential-like names: an LLM's usage, a schema
        '{"usage": {"input_tokens": 1200, "output_tokens": 345, "tokens": 1545}}',
        "tokens_used: 1234",
        "max_tokens: 2048",
        "tokens: [1200, 345]",
        '{"tokens": ["Hello", ",", " world", "internationalization"]}',
        '"keys": ["name", "id"]',
        '{"api_keys": ["OPENAI_API_KEY", "ANTHROPIC_API_KEY"], "secrets": ["db-password", "api-token"]}',
        "passwords_match: true",
        "sort_keys: [created_at, updated_at]",
        # a UI's strings and messages under a password's name, in JSON or on a YAML line
        '{"forgot_password": "Forgot your password?"}',
        '{"password": "See the docs at API2"}',
        "password: Enter your password",
        "password: must be at least 8 characters",
        "password: minimum 12 characters",
        "password_hint: the usual one",
        # code naming an Authorization header's value
        "headers: { Authorization: authToken }",
        "Authorization: auth2Header",
        "    Authorization: auth2Header,",
        # a quoted name under a token's name
        'sort_token: "created_at_desc_order"',
        # a credential read from an object in code (camelCase names count since 3e7c384, and a
        # task holding such code was refused)
        "Fix auth.js so the constructor sets this.clientSecret = options.clientSecret; and add a test",
        "In config.js read clientSecret: process.env.CLIENT_SECRET, and document it",
        "apiKeyValue = config.apiKeyValue",
        "authToken = response.data.authToken2",
        "token = settings.token_for_tests",
    ],
)
def test_counts_names_ui_strings_and_code_stay(text: str) -> None:
    """Ordinary text named like a credential: hidden, a step that read it and wrote it back lost it."""
    assert (redacted(text), redacted_content(text), looks_secret(text)) == (text, text, False)
