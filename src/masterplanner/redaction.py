"""What looks like a credential in text (a key, token, password, private key), and text with it taken out.

What a person types (a task, an answer, a plan or prompt edit, a rating's comment, a chat prompt,
an agent edit), agents' memories, the registry's stored teams and feedback's lessons refuse such
text (`secret_parts`, `secret_refusal`); the audit log, events, logs and every tool result a step's
model reads have it taken out (`redacted`), tracebacks all but the code lines they show
(`redacted_traceback`), and what a tool read is shown without them but for its code
(`redacted_content`). Text cut short is cut where no secret is cut (`shortened`,
`without_cut_secret`): what was left of one no longer had its shape nor its value.

Besides shapes, both know the values of secrets this process holds whatever their shape: those
of its environment variables named as secrets (`*_KEY`, `*_TOKEN`, …), the header values of the
OpenTelemetry exporter's (`OTEL_EXPORTER_OTLP_HEADERS`, …), and those its settings
hold (`configure_secrets`: a password or credential parameter in a URL setting, an MCP server's
secret-named `env` value or `--token` argument), while the settings holding them are in use.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import weakref
from collections.abc import Iterable

__all__ = [
    "CREDENTIAL_PARAMETER",
    "configure_secrets",
    "is_secret_name",
    "looks_secret",
    "redacted",
    "redacted_content",
    "redacted_traceback",
    "secret_parts",
    "secret_refusal",
    "shortened",
    "url_secrets",
    "without_cut_secret",
]

_CREDENTIAL_PARAMETER = (
    r"(?i:[?&](?:[A-Za-z0-9_.-]*(?:password|passwd|secret|token|api[_-]?key)"
    r"|(?:[A-Za-z0-9_.-]*[_-])?(?:key|pwd|auth|signature|credentials?))=)"
)
"""A URL's query parameter named as a credential, to its `=` (`?api_key=`, `&key=`, `?sslpassword=`).

Broad: for taking out of what is shown (`redacted`, `shown_url`), where hiding a `?page_token=`
costs nothing. What a person types is refused on narrower shapes (`_TYPED_QUERY`).
"""
CREDENTIAL_PARAMETER = re.compile(rf"(?P<name>{_CREDENTIAL_PARAMETER})(?P<value>[^&]*)")
"""A credential-named query parameter (`name`, to its `=`) and its value (`value`) in a URL.

The value runs to the next `&`, as a database driver reads it (`?password=s3cr#et` is `s3cr#et`).
"""

_URL_USER = r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/?#@'\"<>\[\]]*:"
"""A URL to the `:` that ends its user name (`scheme://user:`); an IPv6 host (`[::1]`) is none."""
_NOT_A_PORT = r"(?!\d+(?:[/?#\s'\"<>]|$))"
"""What follows `host:` is a port, not a password, when digits end at the path (`example.org:443/@types`)."""

_OWN_SHAPES = (
    # providers' key shapes: a prefix, its separator, then a long run holding a digit. Without
    # the separator and the digit, words matched ("skill-building", "ghost-writer-style",
    # "PKCS1_OAEP_padding"), and a team whose task said so was not stored.
    r"(?i:\b(?:sk|pk|rk)[-_](?=[-_A-Za-z0-9]*\d)[-_A-Za-z0-9]{16,})"
    r"|(?i:\bgh[pousr]_[A-Za-z0-9]{20,}|\bgithub_pat_[A-Za-z0-9_]{20,}|\bxox[abpr]-[-A-Za-z0-9]{10,})"
    r"|\bAKIA[0-9A-Z]{16}\b|\bAIza[-_A-Za-z0-9]{30,}"
    # a private key whole, to its END line (or the text's end, if cut): the header alone left
    # the key's body in what was shown
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----(?:[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----|[\s\S]*)"
    r"|(?i:\bBearer\s+[A-Za-z0-9._~+/-]{16,})"
)
"""Credentials by their own shape: providers' keys, a private key, a bearer token."""

_WRITTEN_AS = (
    r"(?:[_-]?(?:value|b64|base64|hex|raw|plain|plaintext|encoded)"
    r"|[_-]?base(?:(?<=key[_-]base)|(?<=keybase)))"
)
"""A word after a credential's that says how it is written, for case-insensitive use: a
`token_value`, a `password_b64`, Rails' `secret_key_base` (`_base` after a key only: a
`token_base` may be a URL) are credentials, and so are they in camelCase (`apiKeyValue`,
`secretKeyBase`, `clientSecretB64`: shown whole before). A word naming something else (`api_key_id`,
`password_hash`, `token_count`, `secret_name`) names none, and a bare `key`, `pass`, `pwd` or
`auth` with a word after it (`key_value`, `auth_value`) none either."""
_PASSWORD_WORD = rf"pass(?:word|wd|phrase){_WRITTEN_AS}?"
"""A password's name's last word (or words: `password_b64`), for case-insensitive use."""
_KEY_WORD = r"(?:api|secret|access|private)[_-]?key"
"""A key's name's last words that name a credential by themselves (`api_key`, `secretKey`)."""
_NOT_PASSWORD_WORD = rf"(?:{_KEY_WORD}|secret|token){_WRITTEN_AS}?"
"""The credential words `_NAMED` knows but a password's, for case-insensitive use."""
_CREDENTIAL_WORD = (
    rf"(?:{_KEY_WORD}|apikey|secret|token|pass(?:word|wd|phrase)|credentials?){_WRITTEN_AS}?"
    r"|key|pwd|pass|auth"
)
"""The last word of a variable's or a JSON member's name that names a credential (`_ASSIGNED`,
`_MEMBER`), for case-insensitive use."""


def _named(words: str) -> str:
    """A name ending in one of `words` and the `=` or `:` after it (`_NAMED`)."""
    # a name ending in a credential word, alone or as the last part of a longer one
    # (OPENAI_API_KEY=…, DB_PASSWORD=…, X-Api-Key: …): `\b` alone missed `_KEY`, `_` being a
    # word character. The name's earlier parts are one run (not `(?:[A-Za-z0-9]+[_-])*`, which
    # took seconds on a 16 KB `a_a_…` argument: tried from every part, each scanned to the end)
    # a camelCase name's last part begins with its hump (`clientSecret`, `apiKeyValue`), as a
    # JSON member's does (`_member`): before, only a `_` or `-` parted one, and these were shown
    return (
        r"(?<![A-Za-z0-9_-])(?:[A-Za-z0-9_-]*(?:[_-]|(?-i:[a-z0-9](?=[A-Z]))))?"
        rf"(?:{words})(?![A-Za-z0-9_-])\s*[:=]\s*"
    )


_NAMED = _named(f"(?P<shape_password>{_PASSWORD_WORD})|{_NOT_PASSWORD_WORD}")
"""A credential's name and the `=` or `:` after it, to its value (`_NAMED_VALUE`)."""

_RECEIVERS = (
    r"this|self|cls|options|opts|config|cfg|conf|settings|env|process\.env|os\.environ|params|props"
    r"|args|kwargs|ctx|context|req|request|res|response|data|app|secrets|credentials|creds|auth|user"
)
"""Objects code reads a credential from (`options.clientSecret`): such a read is no credential."""

_NAMED_VALUE = (
    # a value of 8 or more characters that holds a digit or is long, and is neither code nor a
    # placeholder: a requirement ("password: minimum 12 characters", "token: bucket"), a reference
    # (`api_key = os.environ['OPENAI_API_KEY']`, `password=${DB_PASSWORD}`) or `YOUR_API_KEY_HERE`
    # is not a credential, and a task saying so was refused; nor is a member of a settings-like
    # object read in code (`this.clientSecret = options.clientSecret;`, `token =
    # settings.token_for_tests`, `clientSecret: process.env.CLIENT_SECRET,`; a dotted passphrase,
    # `correct.horse.battery`, stays one)
    r"(?=\S*\d|\S{12})(?!\S*[()\[\]{}$<>%])(?!(?-i:[A-Z_]+)(?:\s|$))"
    rf"(?!(?:{_RECEIVERS})(?:\.[A-Za-z_]\w*)+[;,]?(?:\s|$))\S{{8,}}"
)

_AUTHORIZATION_NAME = r"(?<![A-Za-z0-9_])(?i:authorization)(?:\\?[\"'])?[ \t]*[:=][ \t]*"
"""An `Authorization` header's name to its value (`Authorization: `, `"Authorization": `, or in a
JSON string holding JSON, `\\"Authorization\\": `)."""
_TOKEN_RUN = r"[A-Za-z0-9._~+/-]"
"""A character of an `Authorization` header's credentials (RFC 9110's token68 but its `=`)."""
_RANDOM_TOKEN = rf"(?={_TOKEN_RUN}*(?:[0-9+/]|[a-z][A-Z]))"
"""Credentials that hold a digit, `+` or `/`, or a lower-case letter before an upper-case one."""

_AUTHORIZATION = (
    # a scheme with parameters (RFC 9110's auth-param: Digest, OAuth 1.0, AWS's signature): the
    # value of the parameter that bears the secret (`response=`, `oauth_signature=`,
    # `Signature=`) goes, the scheme and the other parameters stay (a key id in them goes by its
    # own shape, `_removed`). Before, the first parameter's name was taken for the credentials:
    # `Digest [secret removed]"Mufasa", …, response="…"` showed the signature.
    # Hawk's `id` and `mac` both go: the parameters are read to the last that bears a secret,
    # and those before it in what is kept are taken out in turn (`_removed`).
    rf"(?P<authorization_param>{_AUTHORIZATION_NAME}(?:\\?[\"'])?[A-Za-z][A-Za-z0-9-]*[ \t]+"
    r"(?>[A-Za-z][A-Za-z0-9_-]*[ \t]*=[ \t]*(?:\\?\"[^\"\\\n]*+\\?\"|[^\s,\"'\\]*+)[ \t]*,[ \t]*)*"
    r"(?i:response|oauth_signature|signature|mac|id)[ \t]*=[ \t]*(?:\\?\")?)"
    # the value a signature's: a token's characters and URL escapes (`%2F`), holding a digit, `+`,
    # `/` or an escape, not a placeholder or code (`"%s"`, `$RESPONSE`, `<signature>`)
    r"(?=[^\s\"',\\]*[0-9+/%])(?:[A-Za-z0-9._~+/=-]|%[0-9A-Fa-f]{2})++(?![^\s\"',\\])"
    # an `Authorization` header's credentials, after its scheme if it has one: on a header line,
    # as a request's dump or `curl -H` shows it (`Authorization: Basic dXNlcjpwYXNz`,
    # `Proxy-Authorization: …`), in JSON or in a Python dict (`"Authorization": "Basic …"`). Its
    # name and scheme are kept. The credentials are a word of 8 or more of a token's characters
    # holding a digit, `+` or `/`, or a lower-case letter before an upper-case one, as base64 and
    # keys do and words do not (`Basic authentication`); not a placeholder (`YOUR_BASE64`,
    # `base64encoded`, `your_token`), a variable (`$CREDENTIALS`), code (`f"Basic {encoded}"`) nor
    # a parameter's name (`Credential=`). Unquoted and with no scheme, a value is code more often
    # than not (`headers: { Authorization: authToken }`, `this.apiToken`): a lower-case letter
    # before an upper-case one is no credential there. Before, only a Bearer token of 16
    # characters or more went: a Basic header's `user:password` reached the model whole.
    # (`Proxy-Authorization`'s `Proxy-` is before the match: one that began at each word's start,
    # to take it in, was read at every word of every text)
    rf"|(?P<authorization>{_AUTHORIZATION_NAME}(?:\\?(?P<authorization_quote>[\"']))?"
    r"(?P<authorization_scheme>[A-Za-z][A-Za-z0-9-]*[ \t]+)?"
    # after a scheme, an account or key id and a `:` before the signature (Azure's `SharedKey
    # account:signature`, AWS's v2 `AWS AKIA…:signature`): kept, less a key's own shape in it
    r"(?(authorization_scheme)(?P<authorization_account>[A-Za-z0-9._-]{1,128}+:(?=[A-Za-z0-9+/]))?))"
    r"(?![A-Z0-9_]*_[A-Z0-9_]*(?![A-Za-z0-9._~+/=-]))"
    rf"(?!(?i:your|{_TOKEN_RUN}*(?:base64|encoded|example|placeholder)))"
    rf"(?!{_TOKEN_RUN}*=++(?:\\?[\"'])?[A-Za-z0-9])"
    # with no scheme, upper-case words joined by `-` before a parameter are a scheme, not
    # credentials (`AWS4-HMAC-SHA256 Credential=…`). Any value before ` name=` was taken for one,
    # and a logfmt line's token (`authorization=9944b… user=bob`) was shown.
    r"(?(authorization_scheme)|"
    r"(?!(?-i:[A-Z][A-Z0-9]*(?:-[A-Z][A-Z0-9]*)+)[ \t]+[A-Za-z][A-Za-z0-9_-]*[ \t]*=))"
    # unquoted with no scheme, a camelCase name with digits is code too (`Authorization: auth2Header`)
    rf"(?(authorization_scheme){_RANDOM_TOKEN}|(?(authorization_quote){_RANDOM_TOKEN}|"
    rf"(?={_TOKEN_RUN}*[0-9+/])(?!(?:[a-z_][A-Za-z0-9_]*\.)*+[a-z]++\d*+(?:[A-Z][a-z]{{2,}}+\d*+)++(?!{_TOKEN_RUN}|=))))"
    rf"{_TOKEN_RUN}{{8,}}+=*+(?![^\s\"',;\\])"
    # quoted with no scheme, the credentials end the string: a word before a space is a scheme
    # (`"SharedKeyLite myaccount:[secret removed]"`)
    r"(?(authorization_scheme)|(?(authorization_quote)(?=\\?[\"'])))"
)
"""An `Authorization` header's name, scheme and parameters to the secret one's value
(`authorization_param`, kept) and that value, or its name and scheme (`authorization`, kept) and
its credentials."""

_KEY_SHAPES = (
    # under a name not a password's, lower-case words joined by `_` or `.` in quotes are a name
    # (`sort_token: "created_at_desc_order"`), as `_QUOTED_NAMED` reads them: before, what is shown
    # lost them whole, name and all, and a person typing them was refused
    rf"{_OWN_SHAPES}|(?i:{_NAMED}"
    r"(?(shape_password)|(?![\"'](?-i:[a-z]++(?:[._][a-z]++)++)[\"']))"
    rf"{_NAMED_VALUE})"
)
"""A credential by its shape, or a value given to a name ending in a credential word."""

_URL_SECRETS = (
    # a URL's password (`scheme://user:PASSWORD@host`): only the password goes, the user name and
    # host stay readable. It runs to the token's last `@`, as a password may hold `@`, `/` or `?`
    # unescaped (an `@` later in the URL hides more than the password, never less), within 256
    # characters (unbounded, `x://x://…` took seconds), or, holding none of `@/?#`, however long
    # (a token as password). httpx quotes the whole URL in its errors, and a SearXNG URL with
    # basic auth reached the model so.
    rf"(?P<url_user>{_URL_USER}){_NOT_A_PORT}"
    r"(?P<url_password>[^\s'\"<>]{1,256}(?=@)|[^\s'\"<>@/?#]{257,}(?=@))"
    # a credential-named query parameter's value, however short (`?api_key=…`, `&key=…`,
    # `?password=…`, `?access_token=…`): the name stays, the value goes (and one gone stays so)
    rf"|(?P<query_name>{_CREDENTIAL_PARAMETER})(?!\[secret removed\])(?P<query_value>[^\s&#'\"<>]+)"
)
"""A URL's password (`url_user` kept) or a credential parameter's value (`query_name` kept)."""


def _curl_user(*, typed: bool) -> str:
    r"""A `curl -u user:password` (`--user`): the command to its `:` (`curl_user`, kept), and the password.

    On curl's line (or lines joined by `\`), within 32 arguments of `curl`; a password that is a
    variable or a placeholder (`-u $USER:$PASS`, `admin:<password>`) stays, as does a user alone
    (`-u admin`, curl asks for the password). Not another command's `-u` (`docker run -u 1000:1000`,
    a user and a group). `typed`: only a password read as `_NAMED_VALUE` reads a value (8 or more
    characters holding a digit, or 12), not a docs' `-u user:password`.
    """
    gap = r"(?:[ \t]*+\\\r?\n[ \t]*+|[ \t]++)"
    value = r"(?=[^\s\"']*\d|[^\s\"']{12})(?=[^\s\"']{8})" if typed else ""
    return (
        # each argument is read once (possessive), and at most 32 of them: from each `curl`, a
        # search to the line's end made a long line of them quadratic
        rf"(?P<curl_user>(?<![\w-])curl(?:{gap}(?!-u|--user[ \t=]|curl(?![\w-])|\\\s)\S++){{0,32}}+"
        rf"{gap}(?:-u[ \t]*+|--user(?:[ \t]++|=))[\"']?[^\s:\"'$]++:)"
        rf"(?![^\s\"']*[$<>{{}}()%`]){value}[^\s\"']++"
    )


_CURL_USER = _curl_user(typed=False)
"""curl's `-u user:password` as what is shown takes it out: any password but a variable or a placeholder."""


_RANDOM_WORD = (
    r"(?:(?=[A-Za-z0-9+=_-]*\d)(?=[A-Za-z0-9+=_-]*[A-Za-z])[A-Za-z0-9+=_-]{20,}"
    r"|(?=[A-Za-z0-9+/=_-]*\d)(?=[A-Za-z0-9+/=_-]*[a-z])(?=[A-Za-z0-9+/=_-]*[A-Z])[A-Za-z0-9+/=_-]{20,})"
)
"""What a value named by a bare `key` must look like to be taken for a credential: 20 or more of a
key's characters, letters and digits both, or with `/` (base64) upper- and lower-case letters and
digits all three. `key` alone names an identifier more often than a
secret (a Jira issue's `"key": "PROJ-1234"`, an S3 object's `"Key": "photos/2024/cat.jpg"`, a
setting's `key: user_2024`): taken out, a step that read such data and wrote it back lost them.
Names ending in `_key`, `api_key`, `secret` and the like keep the broader rule."""


def _quoted() -> str:
    """A quoted string's value that looks like a credential, from its opening quote to its closing one.

    Read as an unquoted value is (`_NAMED_VALUE`): one word of 8 or more characters holding a digit
    or 12 long, neither a placeholder (`${API_KEY}`, `YOUR_API_KEY_HERE`) nor a call; an escaped
    quote is part of it. Written out for each quote as runs of a character class between escapes,
    none tried again: a back-reference to the opening quote, tried at each character, took seconds
    on a megabyte's string.
    """
    escape = r"\\\S"
    read = []
    for mark in "\"'":
        plain = rf"[^\s\\{mark}]"
        no_digit = rf"[^\s\\{mark}\d]"
        no_code = rf"[^\s\\{mark}()\[\]{{}}$<>%]"
        read.append(
            rf"(?<={mark})(?!(?-i:[A-Z_]+){mark})"
            rf"(?={no_digit}*+(?:{escape}{no_digit}*+)*+\d|(?:{plain}|{escape}){{12}})"
            rf"(?!{no_code}*+(?:{escape}{no_code}*+)*+[()\[\]{{}}$<>%])"
            rf"(?=(?:{plain}|{escape}){{8}}){plain}*+(?:{escape}{plain}*+)*+(?={mark})"
        )
    return "(?:" + "|".join(read) + ")"


_SENTENCE_WORD = r"(?<![A-Za-z])(?i:you(?:rs?)?|the|please|must|pass(?:word|wd|phrase)s?)(?![A-Za-z])"
"""A word that says words under a password's name are a sentence or a label, not a passphrase."""


def _phrase(*, typed: bool) -> str:
    """A quoted string's value of words that may be a passphrase, from its opening quote to its closing one.

    Words parted by single spaces, none holding code or a placeholder's characters, 8 to 256
    characters in all: 3 to 8 words of 3 or more characters each (`correct horse battery
    staple`), or any number with one word holding a digit between letters or ending 2 letters or
    more (`Tr0ub4dor &3 horse!`, `Winter2024 is cold`), whatever else they hold. `typed`, what a
    person's input is refused for, only what is clearly one: 4 to 8 words of 3 or more letters.
    Plain words are no sentence or label: words ending in `.`, `?`, `!`, `:` or `…`,
    holding `,`, `;` or a typographic apostrophe, or saying "your", "you", "the", "please", "must"
    or "password" (`Forgot your password?`, `Confirm new password`, `The two password fields
    didn't match.`)
    are a UI's text or a message, and stay; so does a message with short words among them
    (`must be at least 8 characters`, `can't be blank`). No escapes: a passphrase with a quote in
    it is not read so.
    """
    read = []
    for mark in "\"'":
        word = rf"[^\s\\{mark}()\[\]{{}}$<>%]"
        spaced = rf"[^\t\n\r\f\v\\{mark}()\[\]{{}}$<>%]"
        # plain words, neither a sentence nor a label
        plain = rf"(?!{spaced}*?(?:[,;\u2019]|[.?!:…]{mark}|{_SENTENCE_WORD}))"
        if typed:
            words = rf"(?={plain}[A-Za-z]{{3,}}+(?: [A-Za-z]{{3,}}+){{3,7}}{mark})"
        else:
            # or, whatever else they hold, a word with digits between letters (`Tr0ub4dor`) or
            # ending 2 letters or more (`Winter2024`; not a version's `v2`)
            words = (
                rf"(?={plain}{word}{{3,}}+(?: {word}{{3,}}+){{2,7}}{mark}"
                # (an acronym and one digit is a name: `API2`, `HTTP2`)
                rf"|{spaced}*?(?:[A-Za-z]\d++[A-Za-z]"
                rf"|(?<![A-Za-z\d])(?![A-Z]++\d(?=[ {mark}]))[A-Za-z]{{2,}}+\d++(?=[ {mark}])))"
            )
        read.append(
            # 8 to 256 characters (a longer string is read no further: each was scanned to its end)
            rf"(?<={mark})(?={spaced}{{8,256}}+{mark}){words}{word}++(?: {word}++)++(?={mark})"
        )
    return "(?:" + "|".join(read) + ")"


_PATH = r"(?=(?:~|\.\.?)?/)(?!(?=\S*[A-Z])(?=\S*[a-z])\S*\d)"
"""A value that is a path (`/home/user/projects`, `~/.ssh/id_ed25519`, `./certs/client.pem`), not a
credential: it begins with `/`, `~/`, `./` or `../`, and does not mix upper-case and lower-case
letters and digits as a key does (a base64 key may begin with `/`: `/wJalrXUtnFEMI/K7MDENG…`)."""

_CODE_NAME = r"(?:[A-Za-z_]+(?:\.[A-Za-z_]+)*|_*[A-Za-z]+\d*(?:[._]+[A-Za-z]+\d*)+_*)[;,]?(?!\S)"
"""A value that names a variable, not a credential: letters joined by `_` or `.` (`hashedPassword`,
`settings.api_key`), or parts joined by `_` or `.`
whose digits only end them (`next_page_token2`, `settings.v2_key`), a `;` or `,` after it
(`config.apiKey;`). One part ending in digits (`summer2024`) is a password more often than not,
and a part with digits inside it (`s3cr3t_v4lue`, `ya29.a0AfH6SMBx7`) a key. Words joined by `-` are
no name in code: a passphrase (`correct-horse-battery-staple`) goes, and so does a `.properties`
message so set (`error.password=Invalid-password-given`), the lesser loss."""

_STRING = r"\"[^\"\\\n]*+(?:\\.[^\"\\\n]*+)*+\"|'[^'\\\n]*+(?:\\.[^'\\\n]*+)*+'"
"""A JSON string, or a Python string as `repr` shows one, on one line."""
_LIST = rf"\[[ \t\r\n]*+(?:(?:{_STRING})[ \t\r\n]*+,[ \t\r\n]*+)*+(?:{_STRING})[ \t\r\n]*+\]"
"""A JSON list of strings (or a Python one), over lines or not."""
_PLURAL_WORD = r"(?i:tokens|secrets|pass(?:word|wd|phrase)s|(?:api|secret|access|private)[_-]?keys|apikeys)"
"""A plural credential name's last word (`tokens`, `api_keys`, `passwords`; not a bare `keys`)."""
_PLURAL_ITEM = rf"{_STRING}|[^\s\[\]{{}},\"'#]++"
"""A string, or a YAML flow sequence's unquoted word, in a list under a plural credential name."""
_PLURAL_LIST = (
    rf"\[[ \t\r\n]*+(?:(?:{_PLURAL_ITEM})[ \t\r\n]*+,[ \t\r\n]*+)*+(?:(?:{_PLURAL_ITEM})[ \t\r\n]*+)?\]"
)
"""A list under a plural credential name (`"tokens": [...]`, `passwords: [a, b]`, `api_keys = [...]`,
over lines or not), as `_MEMBER` and `_ASSIGNED` read one: a string in it that looks random or has
a key's own shape goes (`_PLURAL_SECRET`), the rest stays. Such a name holds a tokenizer's pieces
or a list of names as often as keys, and a count is no list of strings (`"tokens": 345`, `tokens:
[1200, 345]`). Read only where those rules read a name (at a quote, at a line's start): a rule of
its own, tried at every word, cost a tenth more on every text."""


_UNQUOTED_PHRASE = (
    # 3 to 8 words of 3 or more letters, digits or `-` parted by single spaces, none a sentence's
    # word (`password: Enter your password`), to the line's end or its comment
    rf"(?![^\n#]*?{_SENTENCE_WORD})[A-Za-z0-9-]{{3,}}+(?: [A-Za-z0-9-]{{3,}}+){{2,7}}+"
    r"(?=(?:[ \t]+#[^\n]*)?[ \t\r]*(?![^\n]))"
)
"""An unquoted passphrase of plain words set to a password's own name on a line of its own
(`password: correct horse battery staple`, as YAML or ini writes it). Fewer than 3 words, short
words or punctuation (`password: must be at least 8 characters`, `password: minimum 12 characters`)
are a message or a requirement, not one; under a longer name (`reset_password: Send reset link`)
words are a UI's strings more often, as in JSON (`_member`)."""

_ASSIGNED = (
    # a line that sets a credential-named variable, as a .env, ini, YAML or shell file does:
    # `DB_PASSWORD=hunter2hunter2`, `export API_KEY=sk-…`, `password = hunter2hunter2`,
    # `  token: abc123def456`, `- secret: …`, or quoted, `DB_PASS="correcthorse123"`. Its name
    # (and its opening quote) is kept, its value goes. The name ends in a credential word as a part
    # of its own (`DB_PASS`, `SSH_KEY`, `basic_auth`; not `MONKEY`).
    r"(?P<assigned>(?<![^\n])[ \t]*(?:export[ \t]+|-[ \t]+)?"
    r"(?:(?P<shell>(?P<shell_bare>KEY=)|(?!KEY=)(?:[A-Z0-9_]*_)?"
    rf"(?:{_CREDENTIAL_WORD.upper()})=)"
    r"|(?:(?P<assigned_bare>(?i:key))|(?P<assigned_phrase>(?i:pass(?:word|wd|phrase)))(?=[ \t]*[:=])"
    rf"|(?P<assigned_plural>(?:[A-Za-z0-9_.-]*(?:[_.-]|[a-z0-9](?=[A-Z])))?{_PLURAL_WORD})"
    r"|(?!(?i:key)(?:=|[ \t]*:|[ \t]+=))(?:[A-Za-z0-9_.-]*(?:[_.-]|[a-z0-9](?=[A-Z])))?"
    rf"(?i:{_CREDENTIAL_WORD}))"
    r"(?:=|[ \t]*:[ \t]+|[ \t]+=[ \t]*|=[ \t]+))(?P<assigned_quote>[\"'])?)"
    # under a plural name, a list (`_PLURAL_LIST`) and nothing else
    rf"(?(assigned_plural)(?P<assigned_plural_list>{_PLURAL_LIST})(?=(?:[ \t]+#[^\n]*)?[ \t\r]*(?![^\n]))|"
    # a path is no credential, however it is set (`SSH_KEY=~/.ssh/id_ed25519`, `PWD=/home/…`)
    rf"(?!{_PATH})"
    # a bare `key`'s value goes only when it looks random
    rf"(?(shell_bare)(?={_RANDOM_WORD}(?:(?P=assigned_quote)|(?!\S))))"
    rf"(?(assigned_bare)(?={_RANDOM_WORD}(?:(?P=assigned_quote)|(?!\S))))"
    # quoted, the value is the string's, and may be followed by anything (`;`, a comment, an
    # argument): a string is no variable, but unless the line is a shell's, a name or words in
    # quotes stay (`auth_key = "created_at"`), as a JSON member's do (`_MEMBER`)
    r"(?(assigned_quote)(?(shell)|(?![A-Za-z_]+(?:\.[A-Za-z_]+)*(?P=assigned_quote)))"
    + _quoted()
    # unquoted, the value is the line's one word (a comment may follow), a literal as
    # `_NAMED_VALUE` reads it, not ending in `,` (a call's argument, `api_key=settings.api_key,`).
    # Unless the line is a shell's (an upper-case name and `=`, where variables are `$NAME`), a
    # value that names a variable or is words is code, not a credential (`_CODE_NAME`):
    # `api_key = settings.api_key`, `this.apiKey = config.apiKey;`. Taken out, a step that read a
    # source file and wrote it back put the marker into the person's file.
    + rf"|(?:(?(assigned_phrase){_UNQUOTED_PHRASE}|(?!))|(?(shell)|(?!{_CODE_NAME}))"
    r"(?![\"'])(?=\S*\d|\S{12})(?!\S*[()\[\]{}$<>%])(?![A-Z_]+(?!\S))\S{8,}(?<!,))"
    r"(?=(?:[ \t]+#[^\n]*)?[ \t\r]*(?![^\n]))))"
)
"""A credential-named variable set on a line of its own (`assigned`, kept, with its opening quote
if it has one), and its value."""


def _member(phrase: str) -> str:
    """`_MEMBER`, words under a bare password's name read as `phrase` (`_phrase`)."""
    return (
        # a JSON member (or a Python dict's item, as `str(result)` shows one) named as `_ASSIGNED`
        # names a variable, or in camelCase (`accessToken`, `clientSecret`), given a string:
        # `"password": "hunter2hunter2"`. Its name and quotes are kept, its value goes and the JSON
        # stays valid. The quote before the `:` hid it from every other rule.
        r"(?P<member>(?P<member_name_quote>[\"'])(?:(?P<member_bare>(?i:key))"
        # a password's or a secret's name (`member_password`), the whole name a password's
        # (`member_phrase`) or ending in one or in a secret's
        r"|(?P<member_password>(?P<member_phrase>(?i:pass(?:word|wd|phrase)))"
        r"|(?:[A-Za-z0-9_.-]*(?:[_.-]|[a-z0-9](?=[A-Z])))?(?i:pass(?:word|wd|phrase)|secret))(?=[\"'])"
        rf"|(?P<member_plural>(?:[A-Za-z0-9_.-]*(?:[_.-]|[a-z0-9](?=[A-Z])))?{_PLURAL_WORD})(?=[\"'])"
        r"|(?!(?i:key)[\"'])(?:[A-Za-z0-9_.-]*(?:[_.-]|[a-z0-9](?=[A-Z])))?"
        rf"(?i:{_CREDENTIAL_WORD}))"
        r"[\"'][ \t]*:[ \t]*(?P<member_quote>[\"'])?)"
        # under a plural name, a list (`_PLURAL_LIST`) and nothing else
        rf"(?(member_plural)(?P<member_plural_list>{_PLURAL_LIST})|"
        r"(?(member_quote)"
        rf"(?(member_bare)(?={_RANDOM_WORD}(?P=member_quote)))"
        # the value is one word, read as `_ASSIGNED` reads a line's (`_quoted`), and not a name
        # (`"key": "created_at"`, `"translation_key": "settings.title"`: what a bare `key` names in
        # JSON more often than not, and what a YAML file's `key: created_at` keeps too). A string is
        # no variable: dotted words holding a digit are a token (a JWT, `ya29.a0Af…`), not a name.
        rf"(?:(?![A-Za-z_]+(?:\.[A-Za-z_]+)*(?P=member_quote)){_quoted()}"
        # under a password's own name (`password`, not `forgot_password` nor `secret`: a UI's
        # strings are so named), words may be a passphrase (`_phrase`)
        rf"|(?(member_phrase){phrase}|(?!)))"
        # not a string: a password's or a secret's number of 6 or more digits (not `"password": 12`, a
        # policy's length, nor a float), or a list of strings under any credential's name but a bare
        # `key`'s, whose strings are read as a member's string is (`_removed`)
        r"|(?:(?(member_password)(?P<member_number>\d{6,}+)(?![\d.eE])|(?!))"
        rf"|(?(member_bare)(?!)|(?P<member_list>{_LIST})))))"
    )


_MEMBER = _member(_phrase(typed=False))
"""A credential-named JSON member given a string, a number or a list of strings (`member`, to the
string's opening quote, kept), and its value."""
_TYPED_MEMBER = _member(_phrase(typed=True))
"""`_MEMBER` as what a person types is refused for: only words clearly a passphrase are one."""
_MEMBER_STRING = re.compile(rf"([\"'])(?![A-Za-z_]+(?:\.[A-Za-z_]+)*\1)(?:{_quoted()})\1")
"""A string in a list under a credential's name that looks like one, as `_MEMBER` reads a string."""
_MEMBER_PHRASE = re.compile(rf"([\"'])(?:{_phrase(typed=False)})\1")
"""A string in a list under a password's own name that may be a passphrase."""
_TYPED_MEMBER_PHRASE = re.compile(rf"([\"'])(?:{_phrase(typed=True)})\1")
"""A string in a list under a password's own name that is clearly a passphrase (`_TYPED_MEMBER`)."""

_PLURAL_SECRET = re.compile(
    rf"{_OWN_SHAPES}|(?=\S*\d)(?=\S*[A-Za-z])(?!\S*[()\[\]{{}}$<>%])(?!{_CODE_NAME}$)[^\s\"'\\]{{8,}}"
)
"""A string in a list under a plural credential name that is a credential: a key's own shape, or 8
or more characters holding letters and digits both, neither code nor a name (`next_page_token2`)."""

_QUOTED_NAMED = (
    rf"(?P<named>(?i:{_named(f'(?P<named_password>{_PASSWORD_WORD})|{_NOT_PASSWORD_WORD}')})(?P<named_quote>[\"']))"
    # under a name not a password's (`sort_token`, `client_secret`, `cache_key`), lower-case words
    # joined by `_` or `.` are a name, not a credential: `sort_token: "created_at_desc_order"` lost
    # its value in a file a step wrote back. A key has digits or mixes cases; under a password's
    # name such words may be a passphrase (`"correct_horse_battery_staple"`), and go.
    r"(?(named_password)|(?![a-z]++(?:[._][a-z]++)++(?P=named_quote)))" + _quoted()
)
"""A credential's name given a quoted literal anywhere (`password = "…"`, `connect(token='…')`):
its name and opening quote (`named`), kept, and its value."""

_SECRET = re.compile(
    rf"{_URL_SECRETS}|{_AUTHORIZATION}|{_CURL_USER}|{_KEY_SHAPES}|{_QUOTED_NAMED}|{_ASSIGNED}|{_MEMBER}"
)
"""Everything taken out of what is shown (`redacted`): broad, as hiding too much there costs little.

A quoted literal a name is given goes whole with its name (`_KEY_SHAPES`) but in a call
(`client(password="…")`, which `_NAMED_VALUE` reads as code), where its value goes."""

_CODE_SECRET = re.compile(
    rf"{_URL_SECRETS}|{_AUTHORIZATION}|{_CURL_USER}|{_OWN_SHAPES}|{_QUOTED_NAMED}|{_ASSIGNED}|{_MEMBER}"
)
"""What is taken out of a line of source code a traceback shows (`redacted_traceback`), and of
what a tool read (`redacted_content`).

As `_SECRET`, but a credential's name takes its value out only when that value is a quoted
literal, or is set on a line of its own as a configuration file sets it (`_ASSIGNED`):
`api_key = settings.api_key` is code, and the whole line went from tracebacks.
"""

_TYPED_QUERY = (
    r"(?i:[?&](?:[A-Za-z0-9_.-]*[_-])?(?:password|passwd|secret|api[_-]?key|apikey|access[_-]?token|key)=)"
)
"""A query parameter that names a credential beyond doubt (`?api_key=`, `&key=`, not `?page_token=`)."""

_TYPED_SECRET = re.compile(
    # a URL's password as written in a sentence: no `/`, `?` or `@` in it, not a port, and not a
    # placeholder (`https://user:{password}@host`, `:$PASSWORD@`)
    rf"{_URL_USER}{_NOT_A_PORT}(?![^\s/?#@]*[{{}}$<>()])[^\s/?#@'\"<>]+@"
    # a credential-named query parameter's value that looks like one: as for `NAME=value` below,
    # 8 or more characters holding a digit or 12 and more, no code or placeholder
    # (`?api_key={api_key}`, `?token=$TOKEN`, `?key=YOUR_API_KEY_HERE`, `?key=value`)
    rf"|{_TYPED_QUERY}(?=[^\s&#]*\d|[^\s&#]{{12}})(?![^\s&#]*[()\[\]{{}}$<>%])"
    r"(?!(?-i:[A-Z_]+)(?:[\s&#]|$))[^\s&#'\"<>]{8,}"
    rf"|{_AUTHORIZATION}|{_curl_user(typed=True)}|{_KEY_SHAPES}"
    # a JSON member holding a credential (`{"password": "…"}`): its quote before the `:` hid it.
    # Words under a password's name only when clearly a passphrase: a task holding a UI's strings
    # (`{"password": "Confirm new password"}`) was refused
    rf"|{_TYPED_MEMBER}"
)
"""What a person's input, a memory, a stored team or a lesson is refused for (`secret_parts`).

Narrower than `_SECRET` where ordinary text meets URLs: a port before a later `@`
(`http://localhost:8080/?email=bob@example.com`), a parameter such as `?page_token=2` or
`?sort_key=date`, code (`?api_key={api_key}`) and placeholders were refused as secrets.
"""

_SECRET_VARIABLE = re.compile(
    r"(?:KEY|TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIALS?)$"
    rf"|(?:(?:API|SECRET|ACCESS|PRIVATE)_?KEY|TOKEN|SECRET|PASS(?:WORD|WD|PHRASE)|CREDENTIALS?){_WRITTEN_AS.upper()}$"
)
"""Environment variables whose values are secrets by their name (OPENAI_API_KEY, SECRET_KEY_BASE, …)."""
_HEADERS_VARIABLE = re.compile(r"OTEL_EXPORTER_OTLP_(?:[A-Z]+_)?HEADERS")
"""The OpenTelemetry exporter's headers (`OTEL_EXPORTER_OTLP_HEADERS`, `…_TRACES_HEADERS`, …):
the values of those named as credentials are secrets (`_SECRET_HEADER`)."""
_SECRET_HEADER = re.compile(r"auth|key|token|secret|passw|credential|signature|cookie|session|team", re.I)
"""A header whose value is a credential by its name (`Authorization`, `api-key`, `x-honeycomb-team`).

Not every header is: `x-honeycomb-dataset=masterplanner` or `X-Scope-OrgID=tenant-1` name
things, and taken for secrets they were cut out of every log line, tool result and code line
holding the word, and a task naming it was refused."""
REMOVED = "[secret removed]"
_SHORTEST = 8
"""A secret's value shorter than this is not looked for: "dev" or "1234" would be hidden everywhere."""
_ONE_WORD = re.compile(r"[A-Za-z]{8,11}")
"""A secret's value that could be an ordinary word ("postgres", "development").

Taken out of what is shown only where it stands alone (not "postgres" inside "postgresql"), and
what a person types is not refused for holding it: a task saying "development" is no secret's leak.
"""

_CONFIGURED: dict[int, frozenset[str]] = {}
"""The secret values settings objects in use hold (`configure_secrets`), by a number of their own."""
_CONFIGURED_LOCK = threading.Lock()
_NUMBERS = itertools.count()


def is_secret_name(name: str) -> bool:
    """Whether a variable called `name` holds a secret by its name (`OPENAI_API_KEY`, `db-password`)."""
    return _SECRET_VARIABLE.search(name.upper()) is not None


def url_secrets(url: str) -> list[str]:
    """The secrets written into `url`: its password and credential-named query parameters' values.

    Each as written and, if it differs, decoded (`p%40ss` and `p@ss`): a library may quote either.
    """
    from urllib.parse import unquote, urlsplit

    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return []
    found = [password] if password else []
    found += [match.group("value") for match in CREDENTIAL_PARAMETER.finditer("?" + parts.query)]
    return [shown for value in found for shown in dict.fromkeys((value, unquote(value))) if shown]


def _header_secrets(headers: str) -> list[str]:
    """The secrets in an OTLP headers variable's value (`name=value,name=value`, values URL-encoded).

    Of each header named as a credential (`_SECRET_HEADER`), its value as written and decoded
    (`Bearer%20tok` and `Bearer tok`), and each word of it (`tok`): a library may quote either,
    or the token alone.
    """
    from urllib.parse import unquote

    found: list[str] = []
    for pair in headers.split(","):
        name, equals, value = pair.partition("=")
        if equals and _SECRET_HEADER.search(name):
            for shown in dict.fromkeys((value.strip(), unquote(value).strip())):
                found += [shown, *shown.split()]
    return [value for value in dict.fromkeys(found) if value]


def configure_secrets(owner: object, values: Iterable[str]) -> None:
    """Know `values` as secrets (`redacted`, `secret_parts`) for as long as `owner` lives.

    `Settings` call it once validated, with the secrets they hold: a secret set in the settings
    file rather than the environment was shown wherever an error quoted it. Tied to the settings
    object, not to the process, so that settings made and dropped (a test's, a web request's)
    leave no values behind that would hide or refuse text in what comes after.
    """
    known = frozenset(value for value in values if len(value) >= _SHORTEST)
    if not known:
        return
    number = next(_NUMBERS)
    with _CONFIGURED_LOCK:
        _CONFIGURED[number] = known
    weakref.finalize(owner, _forget, number)


def _forget(number: int) -> None:
    with _CONFIGURED_LOCK:
        _CONFIGURED.pop(number, None)


def looks_secret(text: str) -> bool:
    """Whether `text` contains something shaped like a credential (a key, token, password, private key)."""
    return next(iter(_typed(text)), None) is not None


def _secret_values() -> list[str]:
    """The secret values this process holds that are long enough to tell, longest first.

    Its secret environment variables' (`OPENAI_API_KEY`, …), the OTLP exporter's header values
    (`_HEADERS_VARIABLE`: before, an `Authorization` token set there was shown wherever an error
    or a log line quoted it) and those of the settings in use
    (`configure_secrets`); longest first, so that one holding another is taken out whole.
    """
    values = {value for name, value in os.environ.items() if len(value) >= _SHORTEST and is_secret_name(name)}
    values.update(
        value
        for name, headers in os.environ.items()
        if _HEADERS_VARIABLE.fullmatch(name)
        for value in _header_secrets(headers)
        if len(value) >= _SHORTEST
    )
    with _CONFIGURED_LOCK:
        values.update(*_CONFIGURED.values())
    return sorted(values, key=lambda value: (-len(value), value))


def _kept(match: re.Match[str]) -> str:
    """What a match of `_SECRET` or `_CODE_SECRET` keeps: a name and a quoted value's opening quote.

    A URL's user, a parameter's, a variable's, a JSON member's or a quoted credential's name.
    """
    kept = match.groupdict()
    names = (
        "url_user",
        "query_name",
        "authorization_param",
        "authorization",
        "curl_user",
        "named",
        "assigned",
        "member",
    )
    return next((kept[name] for name in names if kept.get(name)), "")


def _removed(match: re.Match[str]) -> str:
    """A match of `_SECRET` without its credential, what it keeps (`_kept`) kept.

    A JSON member's number goes as a string (the JSON stays JSON), and of a list of strings
    under a credential's name, the strings that look like one go.
    """
    kept = _kept(match)
    if match["authorization_account"]:
        # an account before a signature is kept but for a key's own shape (`AWS AKIA…:…`)
        account = match["authorization_account"]
        kept = kept.removesuffix(account) + re.sub(_OWN_SHAPES, REMOVED, account)
    if match["authorization_param"] is not None or match["curl_user"] is not None:
        # the parameters before the signature stay, less what has a key's own shape in them
        # (an AWS header's `Credential=AKIA…`); so do curl's arguments before `-u`, less their
        # secrets (a URL's password, an `Authorization` header's credentials)
        kept = match.re.sub(_removed, kept)
    if match["member_number"] is not None:
        return f"{kept}{match['member_name_quote']}{REMOVED}{match['member_name_quote']}"
    plural = match["member_plural_list"] or match.groupdict().get("assigned_plural_list")
    if plural is not None:
        return kept + _plural_removed(plural)
    if match["member_list"] is not None:
        phrase = None
        if match["member_phrase"] is not None:
            phrase = _TYPED_MEMBER_PHRASE if match.re is _TYPED_SECRET else _MEMBER_PHRASE
        return kept + _list_removed(match["member_list"], phrase)
    return kept + REMOVED


def _plural_removed(listed: str) -> str:
    """A list under a plural credential name, each item that is a credential (`_PLURAL_SECRET`) taken out.

    An unquoted item (YAML's `[a, b]`) becomes a quoted string: the marker unquoted would be a list.
    """

    def removed(item: re.Match[str]) -> str:
        shown = item[0]
        quote = shown[0] if shown[0] in "\"'" else ""
        if not _PLURAL_SECRET.fullmatch(shown[1:-1] if quote else shown):
            return shown
        return f"{quote}{REMOVED}{quote}" if quote else f'"{REMOVED}"'

    return re.sub(_PLURAL_ITEM, removed, listed)


def _list_removed(listed: str, phrase: re.Pattern[str] | None) -> str:
    """A list of strings under a credential's name, each string that looks like one taken out.

    Under a password's own name, so is each that `phrase` reads as a passphrase.
    """

    def removed(string: re.Match[str]) -> str:
        shown = string[0]
        if _MEMBER_STRING.fullmatch(shown) or (phrase is not None and phrase.fullmatch(shown)):
            return shown[0] + REMOVED + shown[0]
        return shown

    return re.sub(_STRING, removed, listed)


def _typed(text: str) -> Iterable[re.Match[str]]:
    """The matches of `_TYPED_SECRET` in `text` that hold a credential.

    A list under a credential's name (`{"password": ["can't be blank"]}`) is one only when a
    string of it looks like one.
    """
    for match in _TYPED_SECRET.finditer(text):
        listed = match["member_list"] is not None or match["member_plural_list"] is not None
        if not listed or _removed(match) != match[0]:
            yield match


def redacted(text: str) -> str:
    """`text` with every credential-shaped part, and every value of a secret variable here, removed.

    A URL keeps its user name and host (`http://alice:[secret removed]@host/…`) and a
    credential-named query parameter its name (`?api_key=[secret removed]`).
    """
    return _SECRET.sub(_removed, _values_removed(text))


def _values_removed(text: str) -> str:
    """`text` with every value of a secret this process holds (`_secret_values`) removed."""
    for value in _secret_values():
        if value not in text:
            continue
        if _ONE_WORD.fullmatch(value):  # alone, not inside a longer word
            text = re.sub(rf"(?<![A-Za-z0-9]){value}(?![A-Za-z0-9])", REMOVED, text)
        else:
            text = text.replace(value, REMOVED)
    return text


def redacted_content(text: str) -> str:
    """`text`, what a tool read or made (a file, a page, a program's output), with its secrets removed.

    Every value of a secret this process holds goes, and so does a key by its own shape, a URL's
    password and a quoted credential's value (`password = "…"`, its name and quotes kept), as from
    a traceback's code, and the value of a credential-named variable a line of a `.env`, ini, YAML
    or shell file sets (`DB_PASSWORD=hunter2hunter2`, `DB_PASS="…"`: `_ASSIGNED`) or a JSON member
    holds (`"password": "hunter2hunter2"`: `_MEMBER`). A name given a variable, words or a path
    (`_CODE_NAME`, `_PATH`), a call or a value within a line (`api_key = settings.api_key`) is not
    a credential: taken out (`redacted` does), a step that read a source file and wrote it back
    put the marker into the person's file.
    """
    return _CODE_SECRET.sub(_removed, _values_removed(text))


_REACH = 1024
"""How far either side of a cut `shortened` looks for a secret the cut falls inside."""
_CUT_WORD = re.compile(r"\S{1,256}\Z")
"""The end of text cut short that may be the start of a secret: its last word, its last 256
characters at most (a longer secret's start keeps its shape, or is a held value's, below)."""
_SHORTEST_PART = 4
"""A held secret's first characters shorter than this are not taken from the end of a cut."""


def shortened(text: str, limit: int) -> str:
    """`text`'s first `limit` characters at most, with no part of a secret the cut falls inside.

    Cut inside a secret, what is left of it no longer has its shape nor is a value held here,
    and would be shown however it is redacted after: the cut is made where that secret begins
    (its URL's user name or variable's name kept). Text no longer than `limit` is as given.
    """
    if len(text) <= limit:
        return text
    low = max(0, limit - _REACH)
    around = text[low : limit + _REACH]
    at = start = limit - low
    for value in _secret_values():
        found = around.find(value, max(0, at - len(value) + 1), at + len(value) - 1)
        if found >= 0:
            start = min(start, found)
    for match in _SECRET.finditer(around):
        if match.start() < at < match.end():
            start = min(start, match.start() + len(_kept(match)))
    return text[: low + min(start, at)]


def without_cut_secret(text: str) -> str:
    """`text`, cut short where what followed is unknown (a capped output), less what may begin a secret.

    Its last word goes (a key, a password or a token the cap fell inside: too short to keep its
    shape, it was shown), and so does an end that begins a secret held here. What is left is
    redacted as any text is. Cut text only: a whole text's last word is no part of anything.
    """
    # from the last 256 characters on: searched from the start, each of a long text's characters
    # began a try of 256 (a megabyte's body took seconds on the event loop)
    word = _CUT_WORD.search(text, max(0, len(text) - 256))
    if word is not None:
        text = text[: word.start()]
    for value in _secret_values():
        for length in range(len(value) - 1, _SHORTEST_PART - 1, -1):
            if text.endswith(value[:length]):
                text = text[:-length]
                break
    return text


_FRAME = re.compile(r'(?P<lead>[ |+-]*)File "[^\n]*", line \d+, in ')
"""A traceback's line naming a frame (`  File "x.py", line 3, in f`; in a group, after `|`s)."""


def redacted_traceback(text: str) -> str:
    """`text`, a traceback (or text holding one), redacted as `redacted` does but for its code.

    The lines of source a frame shows (indented under its `File "…", line N` line) are code: a
    name given a value there (`api_key = settings.api_key`) is no credential, and before, the
    whole line was taken out. Secret values in them still go, and so does a quoted credential
    (`password = "…"`), a key or a URL's password; every other line is redacted whole.
    """
    shown: list[str] = []
    rest: list[str] = []  # lines not yet shown that are not code: redacted together (a key spans lines)
    code_lead: str | None = None  # while in a frame's source lines: how each of them begins
    for line in text.split("\n"):
        if code_lead is not None and line.startswith(code_lead):
            if rest:
                shown.append(redacted("\n".join(rest)))
                rest = []
            shown.append(redacted_content(line))
            continue
        frame = _FRAME.match(line)
        code_lead = None if frame is None else frame["lead"] + "  "
        rest.append(line)
    if rest:
        shown.append(redacted("\n".join(rest)))
    return "\n".join(shown)


def secret_parts(text: str) -> list[str]:
    """The parts of `text` that look like a credential, or are a secret value this process holds.

    A secret value that could be an ordinary word (`_ONE_WORD`) is no part: it is only taken out
    of what is shown. Empty for text that holds none. The parts are for comparing (was this secret
    there before?), never for showing.
    """
    return [value for value in _secret_values() if value in text and not _ONE_WORD.fullmatch(value)] + [
        match.group(0) for match in _typed(text)
    ]


def secret_refusal(what: str, *, not_in: str) -> str:
    """Why a person's input is refused: `what` ("the task") holds what looks like a secret.

    Names the input and where secrets go instead, never the secret itself.
    """
    return (
        f"{what} holds what looks like a secret (an API key, a token or a password, such as "
        f"`OPENAI_API_KEY=…`): put secrets in the environment or the settings file, not in {not_in}"
    )
