//! Sensitive data in prompts: which kinds of secrets and personal data a prompt contains,
//! never what they are. [`scan_json`] reads every string of a request body.
//!
//! [`scan`] reads a prompt's text once, left to right, and at each word boundary tries the
//! detectors that can start with the byte there. Every detector checks a format and, where the
//! format has one, its checksum, so that numbers that merely look right are not findings:
//!
//! | kind | what is found |
//! |---|---|
//! | `api_key` | provider keys and tokens by their published prefixes and lengths: OpenAI `sk-`, Anthropic `sk-ant-`, AWS `AKIA`/`ASIA`, GitHub `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_`/`github_pat_`, GitLab `glpat-`, Slack `xox?-`, Stripe `sk_live_`/`rk_live_`/`sk_test_`, Google `AIza`, Hugging Face `hf_`, npm `npm_`, SendGrid `SG.`, JWTs |
//! | `private_key` | PEM private key blocks (`-----BEGIN ... PRIVATE KEY-----`) |
//! | `card` | payment card numbers: 13-19 digits, plain or grouped, a known issuer prefix and the Luhn check |
//! | `iban` | IBANs: the country's length and the ISO 7064 mod-97 check, plain or in groups of four |
//! | `email` | e-mail addresses (a dotted domain with a letter TLD) |
//! | `phone` | phone numbers: international (`+`, `00`), an area code in parentheses, or national digit groups; dates, IP addresses, thousands and ISBN-like groupings are not |
//! | `national_id` | US SSN (area, group and serial rules), UK National Insurance numbers, Spanish DNI/NIE (check letter), Italian codice fiscale (check character), French NIR (mod-97 key), Dutch BSN (11-check), Brazilian CPF (check digits) |
//!
//! The result is a set of kinds ([`Findings`]); the matched text is never kept, so nothing
//! found can reach a log, a metric or a header. Token-id prompts have no text and are not read.

/// A kind of sensitive finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    ApiKey,
    PrivateKey,
    Card,
    Iban,
    Email,
    Phone,
    NationalId,
}

impl Kind {
    pub const ALL: [Kind; 7] = [Kind::ApiKey, Kind::PrivateKey, Kind::Card, Kind::Iban, Kind::Email, Kind::Phone, Kind::NationalId];

    /// The kind's one spelling (configs, metric labels, the corpus).
    pub fn label(self) -> &'static str {
        match self {
            Kind::ApiKey => "api_key",
            Kind::PrivateKey => "private_key",
            Kind::Card => "card",
            Kind::Iban => "iban",
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::NationalId => "national_id",
        }
    }

    pub fn from_label(label: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.label() == label)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// The kinds a prompt contains.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Findings(u8);

impl Findings {
    pub fn any(self) -> bool {
        self.0 != 0
    }

    pub fn has(self, kind: Kind) -> bool {
        self.0 & kind.bit() != 0
    }

    pub fn add(&mut self, kind: Kind) {
        self.0 |= kind.bit();
    }

    pub fn kinds(self) -> impl Iterator<Item = Kind> {
        Kind::ALL.into_iter().filter(move |k| self.has(*k))
    }

    /// Whether it holds a kind from `wanted`.
    pub fn any_of(self, wanted: Findings) -> bool {
        self.0 & wanted.0 != 0
    }

    /// Every kind.
    pub fn all() -> Findings {
        let mut f = Findings::default();
        Kind::ALL.into_iter().for_each(|k| f.add(k));
        f
    }
}

impl FromIterator<Kind> for Findings {
    fn from_iter<I: IntoIterator<Item = Kind>>(iter: I) -> Findings {
        let mut f = Findings::default();
        iter.into_iter().for_each(|k| f.add(k));
        f
    }
}

/// The kinds of sensitive data in every string of a JSON body (values and keys, at any depth:
/// messages, tool definitions, instructions, metadata alike); `None` when it is not JSON.
pub fn scan_json(body: &[u8]) -> Option<Findings> {
    fn walk(v: &serde_json::Value, found: &mut Findings) {
        match v {
            serde_json::Value::String(s) => found.0 |= scan(s).0,
            serde_json::Value::Array(items) => items.iter().for_each(|x| walk(x, found)),
            serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| {
                found.0 |= scan(k).0;
                walk(x, found);
            }),
            _ => {}
        }
    }
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut found = Findings::default();
    walk(&value, &mut found);
    Some(found)
}

/// The kinds of sensitive data in `text`.
pub fn scan(text: &str) -> Findings {
    let b = text.as_bytes();
    let mut found = Findings::default();
    let mut i = 0;
    while i < b.len() {
        let c = at(b, i);
        if c == b'@' {
            if email_at(b, i) {
                found.add(Kind::Email);
            }
            i += 1;
            continue;
        }
        if is_word(at_back(b, i)) || !(c.is_ascii_alphanumeric() || matches!(c, b'+' | b'(' | b'-')) {
            i += 1;
            continue;
        }
        // Where the next look starts: past a finding, past a whole number (a number is judged
        // whole; its tail is never retried as a number of its own), else the next byte.
        let (kind, end) = match c {
            b'-' => {
                let end = private_key_at(b, i);
                (end.map(|_| Kind::PrivateKey), end)
            }
            b'0'..=b'9' | b'+' | b'(' => {
                let (kind, end) = number_at(b, i);
                (kind, Some(end))
            }
            _ => match word_at(b, i) {
                Some((kind, end)) => (Some(kind), Some(end)),
                None => (None, None),
            },
        };
        if let Some(k) = kind {
            found.add(k);
        }
        i = end.unwrap_or(0).max(i + 1);
    }
    found
}

/// The byte at `i`, or 0 past either end.
fn at(b: &[u8], i: usize) -> u8 {
    b.get(i).copied().unwrap_or(0)
}

/// The byte before `i`, or 0 at the start.
fn at_back(b: &[u8], i: usize) -> u8 {
    i.checked_sub(1).map_or(0, |j| at(b, j))
}

fn is_word(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// How many bytes from `i` on satisfy `ok`.
fn run(b: &[u8], i: usize, ok: impl Fn(u8) -> bool) -> usize {
    b.get(i..).unwrap_or_default().iter().take_while(|c| ok(**c)).count()
}

// ---------------------------------------------------------------------------------------------
// Keys and tokens.

/// A provider's key format: its prefix, the shortest body after it, and the body's alphabet.
struct KeyFormat {
    prefix: &'static [u8],
    min_body: usize,
    max_body: usize,
    body: fn(u8) -> bool,
    /// Random bodies mix letters and digits; a word-only body is a name, not a key.
    mixed: bool,
}

fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}
fn alnum_dash(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}
fn upper_digit(c: u8) -> bool {
    c.is_ascii_uppercase() || c.is_ascii_digit()
}
fn letter(c: u8) -> bool {
    c.is_ascii_alphabetic()
}

const KEYS: &[KeyFormat] = &[
    KeyFormat { prefix: b"sk-ant-", min_body: 32, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"sk-", min_body: 32, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"AKIA", min_body: 16, max_body: 16, body: upper_digit, mixed: false },
    KeyFormat { prefix: b"ASIA", min_body: 16, max_body: 16, body: upper_digit, mixed: false },
    KeyFormat { prefix: b"ghp_", min_body: 36, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"gho_", min_body: 36, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"ghu_", min_body: 36, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"ghs_", min_body: 36, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"ghr_", min_body: 36, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"github_pat_", min_body: 40, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"glpat-", min_body: 20, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"xoxb-", min_body: 20, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"xoxp-", min_body: 20, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"xoxa-", min_body: 20, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"xoxr-", min_body: 20, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"xoxs-", min_body: 20, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"sk_live_", min_body: 24, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"rk_live_", min_body: 24, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"sk_test_", min_body: 24, max_body: usize::MAX, body: alnum, mixed: true },
    KeyFormat { prefix: b"AIza", min_body: 35, max_body: usize::MAX, body: alnum_dash, mixed: true },
    KeyFormat { prefix: b"hf_", min_body: 34, max_body: usize::MAX, body: letter, mixed: false },
    KeyFormat { prefix: b"npm_", min_body: 36, max_body: usize::MAX, body: alnum, mixed: true },
];

/// A finding that starts with a letter at `i` (a word boundary): a key, an IBAN or a
/// national id written with letters.
fn word_at(b: &[u8], i: usize) -> Option<(Kind, usize)> {
    key_at(b, i)
        .map(|end| (Kind::ApiKey, end))
        .or_else(|| iban_at(b, i).map(|end| (Kind::Iban, end)))
        .or_else(|| lettered_id_at(b, i).map(|end| (Kind::NationalId, end)))
}

fn key_at(b: &[u8], i: usize) -> Option<usize> {
    let rest = b.get(i..)?;
    if rest.starts_with(b"eyJ") {
        return jwt_at(b, i);
    }
    if rest.starts_with(b"SG.") {
        return sendgrid_at(b, i);
    }
    let f = KEYS.iter().find(|f| rest.starts_with(f.prefix))?;
    let start = i + f.prefix.len();
    let n = run(b, start, f.body);
    let body = b.get(start..start + n)?;
    let mixed = body.iter().any(u8::is_ascii_digit) && body.iter().any(u8::is_ascii_alphabetic);
    ((f.min_body..=f.max_body).contains(&n) && (mixed || !f.mixed) && !is_word(at(b, start + n))).then_some(start + n)
}

fn base64url(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-' || c == b'_'
}

/// `header.payload.signature`, each base64url, the header and payload JSON objects (`eyJ`).
fn jwt_at(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i;
    for part in 0..3 {
        let n = run(b, j, base64url);
        if n < 10 || (part == 1 && b.get(j..j + 3) != Some(b"eyJ")) {
            return None;
        }
        j += n;
        if part < 2 {
            if at(b, j) != b'.' {
                return None;
            }
            j += 1;
        }
    }
    Some(j)
}

/// SendGrid: `SG.` + 22 + `.` + 43 base64url characters.
fn sendgrid_at(b: &[u8], i: usize) -> Option<usize> {
    let a = run(b, i + 3, base64url);
    let dot = i + 3 + a;
    let c = run(b, dot + 1, base64url);
    (a == 22 && at(b, dot) == b'.' && c == 43).then_some(dot + 1 + c)
}

/// A PEM private key block's header line.
fn private_key_at(b: &[u8], i: usize) -> Option<usize> {
    let rest = b.get(i..)?;
    if !rest.starts_with(b"-----BEGIN ") {
        return None;
    }
    let line = rest.get(11..rest.len().min(11 + 40))?;
    let end = line.windows(16).position(|w| w == b"PRIVATE KEY-----")?;
    Some(i + 11 + end + 16)
}

// ---------------------------------------------------------------------------------------------
// E-mail.

/// An address around the `@` at `i`: a local part before it, a dotted domain after it whose
/// last label has at least two letters.
fn email_at(b: &[u8], i: usize) -> bool {
    let local = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'%' | b'+' | b'-');
    let before = b.get(..i).unwrap_or_default().iter().rev().take_while(|c| local(**c)).count();
    if before == 0 || at_back(b, i) == b'.' {
        return false;
    }
    let (mut j, mut labels, mut last_letters) = (i + 1, 0, false);
    loop {
        let n = run(b, j, |c| c.is_ascii_alphanumeric() || c == b'-');
        if n == 0 {
            break;
        }
        last_letters = n >= 2 && b.get(j..j + n).is_some_and(|l| l.iter().all(u8::is_ascii_alphabetic));
        labels += 1;
        j += n;
        if at(b, j) == b'.' && at(b, j + 1).is_ascii_alphanumeric() {
            j += 1;
        } else {
            break;
        }
    }
    labels >= 2 && last_letters
}

// ---------------------------------------------------------------------------------------------
// IBAN and national ids written with letters.

/// IBAN lengths by country (ISO 13616 registry).
const IBAN_LENGTHS: &[(&[u8; 2], usize)] = &[
    (b"AD", 24), (b"AE", 23), (b"AL", 28), (b"AT", 20), (b"AZ", 28), (b"BA", 20), (b"BE", 16), (b"BG", 22),
    (b"BH", 22), (b"BR", 29), (b"CH", 21), (b"CR", 22), (b"CY", 28), (b"CZ", 24), (b"DE", 22), (b"DK", 18),
    (b"DO", 28), (b"EE", 20), (b"EG", 29), (b"ES", 24), (b"FI", 18), (b"FO", 18), (b"FR", 27), (b"GB", 22),
    (b"GE", 22), (b"GI", 23), (b"GL", 18), (b"GR", 27), (b"GT", 28), (b"HR", 21), (b"HU", 28), (b"IE", 22),
    (b"IL", 23), (b"IS", 26), (b"IT", 27), (b"JO", 30), (b"KW", 30), (b"KZ", 20), (b"LB", 28), (b"LI", 21),
    (b"LT", 20), (b"LU", 20), (b"LV", 21), (b"MC", 27), (b"MD", 24), (b"ME", 22), (b"MK", 19), (b"MR", 27),
    (b"MT", 31), (b"MU", 30), (b"NL", 18), (b"NO", 15), (b"PK", 24), (b"PL", 28), (b"PS", 29), (b"PT", 25),
    (b"QA", 29), (b"RO", 24), (b"RS", 22), (b"SA", 24), (b"SE", 24), (b"SI", 19), (b"SK", 24), (b"SM", 27),
    (b"TN", 24), (b"TR", 26), (b"UA", 29), (b"VG", 24), (b"XK", 20),
];

fn iban_at(b: &[u8], i: usize) -> Option<usize> {
    let cc = b.get(i..i + 2)?;
    if !(cc.iter().all(u8::is_ascii_uppercase) && at(b, i + 2).is_ascii_digit() && at(b, i + 3).is_ascii_digit()) {
        return None;
    }
    let len = IBAN_LENGTHS.iter().find(|(c, _)| c.as_slice() == cc)?.1;
    // The characters, spaces between groups of four skipped.
    let mut chars = Vec::with_capacity(len);
    let mut j = i;
    while chars.len() < len {
        let c = at(b, j);
        if upper_digit(c) {
            chars.push(c);
            j += 1;
        } else if c == b' ' && chars.len() % 4 == 0 && upper_digit(at(b, j + 1)) {
            j += 1;
        } else {
            return None;
        }
    }
    if is_word(at(b, j)) {
        return None;
    }
    // Mod 97 of the rearranged string, letters as 10..35.
    let rearranged = chars.iter().skip(4).chain(chars.iter().take(4));
    let rem = rearranged.fold(0u32, |acc, c| {
        let v = if c.is_ascii_digit() { u32::from(c - b'0') } else { u32::from(c - b'A') + 10 };
        if v >= 10 { (acc * 100 + v) % 97 } else { (acc * 10 + v) % 97 }
    });
    (rem == 1).then_some(j)
}

/// UK NINO, Spanish NIE, Italian codice fiscale.
fn lettered_id_at(b: &[u8], i: usize) -> Option<usize> {
    nino_at(b, i).or_else(|| nie_at(b, i)).or_else(|| codice_fiscale_at(b, i))
}

/// UK National Insurance number: two prefix letters (not D, F, I, Q, U, V; second not O; not
/// the reserved pairs), six digits (optionally in pairs), a suffix A-D.
fn nino_at(b: &[u8], i: usize) -> Option<usize> {
    let (a, c) = (at(b, i), at(b, i + 1));
    let first_ok = a.is_ascii_uppercase() && !b"DFIQUV".contains(&a);
    let second_ok = c.is_ascii_uppercase() && !b"DFIQUVO".contains(&c);
    let reserved = [b"BG", b"GB", b"NK", b"KN", b"TN", b"NT", b"ZZ"].iter().any(|p| p.as_slice() == [a, c]);
    if !(first_ok && second_ok) || reserved {
        return None;
    }
    let mut j = i + 2;
    let spaced = at(b, j) == b' ';
    for _ in 0..3 {
        if spaced {
            if at(b, j) != b' ' {
                return None;
            }
            j += 1;
        }
        if !(at(b, j).is_ascii_digit() && at(b, j + 1).is_ascii_digit()) {
            return None;
        }
        j += 2;
    }
    if spaced && at(b, j) == b' ' {
        j += 1;
    }
    let suffix = at(b, j);
    (matches!(suffix, b'A'..=b'D') && !is_word(at(b, j + 1))).then_some(j + 1)
}

/// Spanish NIE: X, Y or Z, seven digits, the DNI check letter of the number with X=0, Y=1, Z=2.
fn nie_at(b: &[u8], i: usize) -> Option<usize> {
    let lead = match at(b, i) {
        b'X' => 0,
        b'Y' => 1,
        b'Z' => 2,
        _ => return None,
    };
    if run(b, i + 1, |c| c.is_ascii_digit()) != 7 {
        return None;
    }
    let n = b.get(i + 1..i + 8)?.iter().fold(lead, |acc, x| acc * 10 + u32::from(x - b'0'));
    (dni_letter(n) == Some(at(b, i + 8)) && !is_word(at(b, i + 9))).then_some(i + 9)
}

/// Italian codice fiscale: 6 letters, 2 digits, a month letter, 2 digits, a letter and 3
/// digits, and the check character computed from the odd and even positions.
fn codice_fiscale_at(b: &[u8], i: usize) -> Option<usize> {
    let s = b.get(i..i + 16)?;
    if is_word(at(b, i + 16)) {
        return None;
    }
    let shape = |k: usize, c: u8| match k {
        0..=5 | 8 | 11 | 15 => c.is_ascii_uppercase(),
        _ => c.is_ascii_digit(),
    };
    if !s.iter().enumerate().all(|(k, c)| shape(k, *c)) || !b"ABCDEHLMPRST".contains(s.get(8)?) {
        return None;
    }
    const ODD: [u32; 26] = [1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23];
    let sum: u32 = s.iter().take(15).enumerate().map(|(k, c)| {
        let v = if c.is_ascii_digit() { usize::from(c - b'0') } else { usize::from(c - b'A') };
        if k % 2 == 0 { ODD.get(v).copied().unwrap_or(0) } else { v as u32 }
    }).sum();
    (u32::from(*s.get(15)? - b'A') == sum % 26).then_some(i + 16)
}

mod numbers;
use numbers::{dni_letter, number_at};

#[cfg(test)]
mod tests;
