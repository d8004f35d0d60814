#!/usr/bin/env python3
"""A labelled corpus for kvroute's sensitivity classifier (core/src/sensitive.rs).

Writes JSON lines {"text": ..., "kinds": [...]}: ordinary prompts (prose, code, configs,
tables) of 0.2-4 KiB, about half with one or two planted findings whose values come from the
PyPI package `faker` in many locales (or, where faker has no generator, from the format's
published rules), and most with near-misses planted too: numbers that fail Luhn or a
checksum, invalid SSNs, dates, amounts, IP addresses, versions, ISBNs, hashes, UUIDs, and
code that names keys without holding one. `kinds` lists what was planted, nothing else.

    python3 bench/sensitivity/corpus.py --n 12000 --seed 7 > corpus.jsonl
"""
import argparse
import base64
import json
import random
import string
import sys

from faker import Faker

LOCALES = ["en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "ja_JP", "pt_BR", "en_IN", "en_AU", "en_CA", "pl_PL", "sv_SE"]
ALNUM = string.ascii_letters + string.digits


def rand(r, n, alphabet=ALNUM):
    s = "".join(r.choice(alphabet) for _ in range(n))
    # Random keys mix letters and digits; make sure a short draw does too (from its alphabet).
    letters = [c for c in alphabet if c.isalpha()]
    return s[:-2] + r.choice(letters) + r.choice(string.digits)


def jwt(r, fake):
    b64 = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()
    head = b64({"alg": r.choice(["HS256", "RS256"]), "typ": "JWT"})
    body = b64({"sub": fake.uuid4(), "name": fake.name(), "iat": r.randint(1_600_000_000, 1_800_000_000)})
    return f"{head}.{body}.{rand(r, 43, ALNUM + '-_')}"


def api_key(r, fake):
    return r.choice([
        lambda: "sk-proj-" + rand(r, r.choice([48, 56, 64]), ALNUM + "-_"),
        lambda: "sk-" + rand(r, 48),
        lambda: "sk-ant-api03-" + rand(r, 93, ALNUM + "-_") + "AA",
        lambda: "AKIA" + rand(r, 16, string.ascii_uppercase + string.digits),
        lambda: "ASIA" + rand(r, 16, string.ascii_uppercase + string.digits),
        lambda: r.choice(["ghp_", "gho_", "ghs_", "ghu_"]) + rand(r, 36),
        lambda: "github_pat_11" + rand(r, 20, string.ascii_uppercase + string.digits) + "_" + rand(r, 59),
        lambda: "glpat-" + rand(r, 20, ALNUM + "-_"),
        lambda: r.choice(["xoxb-", "xoxp-"]) + f"{r.randint(10**10, 10**12)}-{r.randint(10**10, 10**12)}-" + rand(r, 24),
        lambda: r.choice(["sk_live_", "rk_live_", "sk_test_"]) + rand(r, r.choice([24, 99])),
        lambda: "AIza" + rand(r, 35, ALNUM + "-_"),
        lambda: "hf_" + "".join(r.choice(string.ascii_letters) for _ in range(34)),
        lambda: "npm_" + rand(r, 36),
        lambda: "SG." + rand(r, 22, ALNUM + "-_") + "." + rand(r, 43, ALNUM + "-_"),
        lambda: jwt(r, fake),
    ])()


def private_key(r, fake):
    kind = r.choice(["RSA ", "EC ", "OPENSSH ", "", "ENCRYPTED "])
    lines = [base64.b64encode(bytes(r.getrandbits(8) for _ in range(48))).decode() for _ in range(r.randint(2, 6))]
    return f"-----BEGIN {kind}PRIVATE KEY-----\n" + "\n".join(lines) + f"\n-----END {kind}PRIVATE KEY-----"


def group4(s, sep=" "):
    return sep.join(s[i:i + 4] for i in range(0, len(s), 4))


def card(r, fake):
    n = fake.credit_card_number(card_type=r.choice(["visa16", "visa13", "mastercard", "amex", "discover", "jcb15", "jcb16", "diners"]))
    return r.choice([n, n, group4(n), group4(n, "-")]) if len(n) == 16 else n


# ISO 13616 registry lengths of the countries faker's locales draw. Faker's GB IBANs (en_GB,
# en_IN, ja_JP...) are 21 characters, one short of GB's 22: no such IBAN exists, so a locale
# that draws one is replaced by one of the locales whose IBANs are well formed.
IBAN_LENGTHS = {"GB": 22, "DE": 22, "FR": 27, "ES": 24, "IT": 27, "NL": 18, "BR": 29, "PL": 28, "SE": 24, "AT": 20, "BE": 16, "CH": 21}
IBAN_LOCALES = ["de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pt_BR", "pl_PL", "sv_SE"]


def iban(r, fake):
    v = fake.iban()
    if IBAN_LENGTHS.get(v[:2], len(v)) != len(v):
        v = Faker(r.choice(IBAN_LOCALES)).iban()
    return r.choice([v, v, group4(v)])


def email(r, fake):
    return r.choice([fake.email, fake.company_email, fake.free_email, fake.ascii_email])()


def phone(r, fake):
    return fake.phone_number()


def nino(r):
    first = r.choice([c for c in string.ascii_uppercase if c not in "DFIQUVZ"])
    second = r.choice([c for c in string.ascii_uppercase if c not in "DFIQUVO"])
    while first + second in ("BG", "GB", "NK", "KN", "TN", "NT"):
        second = r.choice([c for c in string.ascii_uppercase if c not in "DFIQUVO"])
    d = [f"{r.randint(0, 99):02d}" for _ in range(3)]
    suffix = r.choice("ABCD")
    return r.choice([f"{first}{second}{''.join(d)}{suffix}", f"{first}{second} {' '.join(d)} {suffix}"])


def national_id(r, fake):
    """(value, the words a person would name it with)."""
    which = r.choice(["us", "uk", "es_dni", "es_nie", "it", "fr", "nl", "br"])
    if which == "us":
        return Faker("en_US").ssn(), "SSN"
    if which == "uk":
        return nino(r), "National Insurance number"
    if which == "es_dni":
        return Faker("es_ES").nif(), "DNI"
    if which == "es_nie":
        return Faker("es_ES").nie(), "NIE"
    if which == "it":
        return Faker("it_IT").ssn(), "codice fiscale"
    if which == "fr":
        return Faker("fr_FR").ssn(), "numéro de sécurité sociale"
    if which == "nl":
        return Faker("nl_NL").ssn(), "BSN"
    return Faker("pt_BR").cpf(), "CPF"


FINDINGS = {
    "api_key": lambda r, f: (api_key(r, f), "key"),
    "private_key": lambda r, f: (private_key(r, f), "private key"),
    "card": lambda r, f: (card(r, f), "card"),
    "iban": lambda r, f: (iban(r, f), "IBAN"),
    "email": lambda r, f: (email(r, f), "email"),
    "phone": lambda r, f: (phone(r, f), "phone"),
    "national_id": national_id,
}

# How a value sits in a prompt: {v} the value, {n} what a person calls it.
CONTEXTS = [
    "My {n} is {v}.",
    "Here it is: {v}",
    "{v}",
    "Can you check whether {v} is right?",
    "The customer wrote: \"please update my details, {n}: {v}, thanks\"",
    "| field | value |\n|---|---|\n| {n} | {v} |",
    "config:\n  {n}: {v}\n",
    "Error log:\n[2024-05-01 12:00:03] request failed for {v} (retrying)\n",
    "Translate to French: 'Contact me with {v} tomorrow.'",
    "{v} <- is this formatted correctly?",
]


def near_miss(r, fake):
    """Text that resembles a finding and is none."""
    def bad_luhn():
        n = fake.credit_card_number(card_type="visa16")
        last = str((int(n[-1]) + r.randint(1, 9)) % 10)
        return r.choice([n[:-1] + last, group4(n[:-1] + last)])

    def bad_iban():
        v = fake.iban()
        i = r.randrange(4, len(v))
        while not v[i].isdigit():
            i = r.randrange(4, len(v))
        return v[:i] + str((int(v[i]) + r.randint(1, 9)) % 10) + v[i + 1:]

    return r.choice([
        bad_luhn,
        bad_iban,
        lambda: f"{r.choice(['000', '666', str(r.randint(900, 999))])}-{r.randint(1, 99):02d}-{r.randint(1, 9999):04d}",
        lambda: f"Order #{r.randint(10**7, 10**12)}",
        lambda: f"invoice INV-{r.randint(2019, 2026)}-{r.randint(1, 999999):06d}",
        lambda: fake.date(pattern=r.choice(["%Y-%m-%d", "%d.%m.%Y", "%m/%d/%Y", "%d/%m/%Y"])),
        lambda: f"{fake.date()} {fake.time()}",
        lambda: fake.ipv4(),
        lambda: f"{fake.ipv4()}:{r.randint(1024, 65535)}",
        lambda: f"v{r.randint(0, 20)}.{r.randint(0, 40)}.{r.randint(0, 200)}",
        lambda: fake.isbn13(),
        lambda: fake.isbn10(),
        lambda: f"${r.randint(1, 999)},{r.randint(0, 999):03d}.{r.randint(0, 99):02d}",
        lambda: f"€{r.randint(1, 999)}.{r.randint(0, 999):03d},{r.randint(0, 99):02d}",
        lambda: f"{r.uniform(-90, 90):.6f}, {r.uniform(-180, 180):.6f}",
        lambda: fake.sha256(),
        lambda: fake.sha1()[:r.choice([7, 12, 40])],
        lambda: fake.uuid4(),
        lambda: f"{r.randint(10**8, 10**9 - 1)}",
        lambda: f"{r.randint(10**10, 10**11 - 1)}",
        lambda: "api_key = os.environ[\"OPENAI_API_KEY\"]",
        lambda: "const token = process.env.GITHUB_TOKEN; // starts with ghp_",
        lambda: "from sklearn.linear_model import LogisticRegression  # sk-learn",
        lambda: "AWS access key ids start with AKIA followed by 16 characters",
        lambda: "Set SLACK_BOT_TOKEN=xoxb-your-token-here in .env",
        lambda: "@app.route('/users/<int:user_id>')",
        lambda: "ssh git@github",
        lambda: f"{fake.user_name()} at {fake.domain_word()} dot com",
        lambda: "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----",
        lambda: "-----BEGIN CERTIFICATE-----",
        lambda: " ".join(str(r.randint(1, 99)) for _ in range(r.randint(4, 9))),
        lambda: f"tracking 1Z{rand(r, 6, string.ascii_uppercase + string.digits)}{r.randint(10**9, 10**10 - 1)}",
        lambda: f"{r.randint(1, 9)}.{r.randint(100, 999)}.{r.randint(100, 999)} requests",
        lambda: f"build {r.randint(1000, 9999)}-{r.randint(10, 99)}-{r.randint(1000, 9999)}-{r.randint(10, 99)}",
    ])()


def filler(r, fake):
    """An ordinary piece of a prompt."""
    return r.choice([
        lambda: fake.paragraph(nb_sentences=r.randint(2, 8)),
        lambda: "\n".join(fake.sentences(r.randint(2, 5))),
        lambda: "```python\ndef {}(x):\n    return x * {}\n```".format(fake.word(), r.randint(2, 99)),
        lambda: "```json\n" + json.dumps({fake.word(): fake.word(), "count": r.randint(0, 500), "ok": True}) + "\n```",
        lambda: "| name | city | score |\n|---|---|---|\n" + "\n".join(f"| {fake.first_name()} | {fake.city()} | {r.randint(0, 100)} |" for _ in range(r.randint(2, 5))),
        lambda: f"Summarize the following for a {fake.job()}:\n{fake.text(max_nb_chars=600)}",
        lambda: f"Write a short story set in {fake.city()} about {fake.catch_phrase().lower()}.",
    ])()


def prompt(r, fakes):
    fake = r.choice(fakes)
    parts = [filler(r, fake) for _ in range(r.randint(1, 5))]
    kinds = set()
    if r.random() < 0.5:
        for kind in r.sample(sorted(FINDINGS), r.choice([1, 1, 1, 2])):
            value, name = FINDINGS[kind](r, fake)
            parts.insert(r.randrange(len(parts) + 1), r.choice(CONTEXTS).format(v=value, n=name))
            kinds.add(kind)
    for _ in range(r.choice([0, 1, 1, 2, 3])):
        parts.insert(r.randrange(len(parts) + 1), near_miss(r, fake))
    return {"text": "\n\n".join(parts), "kinds": sorted(kinds)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=12000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    r = random.Random(a.seed)
    Faker.seed(a.seed)
    fakes = [Faker(loc) for loc in LOCALES]
    for f in fakes:
        f.seed_instance(r.randint(0, 2**31))
    out = sys.stdout
    for _ in range(a.n):
        out.write(json.dumps(prompt(r, fakes), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
