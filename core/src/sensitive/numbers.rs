//! Numbers: cards, phones and digit-only national ids, each judged on the whole run of digits
//! and separators it is written as.

use super::{at, is_word, run, Kind};

/// A run of digits with the separators between them, as read from a word boundary.
struct Span {
    /// The digits, in order (at most [`MAX_DIGITS`]).
    digits: Vec<u8>,
    /// Length of each digit group.
    groups: Vec<usize>,
    /// The separators seen between groups (`' '`, `'-'`, `'.'`, `'/'`, `'('`, `')'`).
    seps: Vec<u8>,
    plus: bool,
    paren: bool,
    end: usize,
    /// The byte right after the span.
    after: u8,
}

const MAX_DIGITS: usize = 24;

fn read_span(b: &[u8], i: usize) -> Span {
    let mut s = Span { digits: Vec::new(), groups: Vec::new(), seps: Vec::new(), plus: false, paren: false, end: i, after: 0 };
    let mut j = i;
    if at(b, j) == b'+' {
        s.plus = true;
        j += 1;
    }
    let mut pending_sep = 0;
    loop {
        let c = at(b, j);
        if c.is_ascii_digit() {
            let n = run(b, j, |c| c.is_ascii_digit());
            if s.digits.len() + n > MAX_DIGITS {
                s.digits.clear();
                s.groups.clear();
                s.end = j + n;
                s.after = at(b, j + n);
                return s;
            }
            s.digits.extend(b.get(j..j + n).unwrap_or_default().iter().map(|c| c - b'0'));
            s.groups.push(n);
            j += n;
            s.end = j;
            pending_sep = 0;
        } else if matches!(c, b' ' | b'-' | b'.' | b'/' | b'(' | b')') && pending_sep < 2 {
            // A separator is part of the span only if a digit follows within two bytes.
            let next = at(b, j + 1);
            let continues = next.is_ascii_digit() || (pending_sep == 0 && matches!(next, b' ' | b'(' | b')' | b'-') && at(b, j + 2).is_ascii_digit());
            if !continues || (c == b'.' && s.groups.is_empty()) {
                break;
            }
            if c == b'(' || c == b')' {
                s.paren = true;
            }
            s.seps.push(c);
            pending_sep += 1;
            j += 1;
        } else {
            break;
        }
    }
    s.after = at(b, s.end);
    s
}

/// The number read from `i`: what it is, if anything, and where it ends.
pub(super) fn number_at(b: &[u8], i: usize) -> (Option<Kind>, usize) {
    let s = read_span(b, i);
    if s.digits.is_empty() {
        return (None, s.end);
    }
    // Glued to a word on the right ("12ab"): an identifier, except a DNI's check letter and a
    // phone extension ("x123").
    let extension = s.after == b'x' && at(b, s.end + 1).is_ascii_digit();
    let kind = if is_word(s.after) && !extension {
        digit_letter_id(b, &s).then_some(Kind::NationalId)
    } else if card(&s) {
        Some(Kind::Card)
    } else if ssn(b, i, &s) || digit_id(b, i, &s) {
        Some(Kind::NationalId)
    } else if phone(b, i, &s) {
        Some(Kind::Phone)
    } else {
        None
    };
    (kind, s.end)
}

/// Whether one of `words` (lowercase) ends within the 40 bytes before `i`: the context some
/// bare numbers need before they count (a 9-digit number is a Dutch BSN only when named so).
fn named_before(b: &[u8], i: usize, words: &[&[u8]]) -> bool {
    let window = b.get(i.saturating_sub(40)..i).unwrap_or_default().to_ascii_lowercase();
    words.iter().any(|w| window.windows(w.len()).any(|x| x == *w))
}

const PHONE_WORDS: &[&[u8]] = &[b"phone", b"tel:", b"tel.", b"tel ", b"telefon", b"call", b"mobile", b"cell", b"fax", b"whatsapp", b"sms", b"text me"];
const BSN_WORDS: &[&[u8]] = &[b"bsn", b"burgerservice", b"sofi"];

fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits.iter().rev().enumerate().map(|(k, d)| {
        let d = u32::from(*d);
        if k % 2 == 1 {
            let x = d * 2;
            if x > 9 { x - 9 } else { x }
        } else {
            d
        }
    }).sum();
    sum.is_multiple_of(10)
}

fn prefix_num(digits: &[u8], n: usize) -> u32 {
    digits.iter().take(n).fold(0, |acc, d| acc * 10 + u32::from(*d))
}

/// An issuer's prefix with its lengths: Visa 4 (13, 16, 19), Mastercard 51-55 and 2221-2720
/// (16), Amex 34/37 (15), Discover 6011/644-649/65 (16-19), Diners 300-305/36/38/39 (14-19),
/// JCB 35 (16-19) and the old 15-digit 1800/2131, Maestro and UnionPay 50/56-69 (12-19).
fn known_issuer(d: &[u8]) -> bool {
    let (n, p1, p2, p3, p4) = (d.len(), prefix_num(d, 1), prefix_num(d, 2), prefix_num(d, 3), prefix_num(d, 4));
    let visa = p1 == 4 && matches!(n, 13 | 16 | 19);
    let mastercard = ((51..=55).contains(&p2) || (2221..=2720).contains(&p4)) && n == 16;
    let amex = matches!(p2, 34 | 37) && n == 15;
    let discover = (p4 == 6011 || (644..=649).contains(&p3) || p2 == 65) && n >= 16;
    let diners = ((300..=305).contains(&p3) || matches!(p2, 36 | 38 | 39)) && n >= 14;
    let jcb = (p2 == 35 && n >= 16) || (matches!(p4, 1800 | 2131) && n == 15);
    let maestro = (p2 == 50 || (56..=69).contains(&p2)) && n >= 12;
    visa || mastercard || amex || discover || diners || jcb || maestro
}

fn card(s: &Span) -> bool {
    let n = s.digits.len();
    let tidy = s.seps.iter().all(|c| matches!(c, b' ' | b'-')) && !s.plus && !s.paren;
    // Grouped as cards print: fours (Amex 4-6-5, Diners 4-6-4), or not grouped at all.
    let grouped = s.groups.len() == 1
        || s.groups.iter().take(s.groups.len().saturating_sub(1)).all(|g| *g == 4)
        || matches!(s.groups.as_slice(), [4, 6, 5] | [4, 6, 4]);
    (13..=19).contains(&n) && tidy && grouped && known_issuer(&s.digits) && luhn(&s.digits)
}

/// US SSN `AAA-GG-SSSS`: area not 000, 666 or 9xx; group not 00; serial not 0000.
fn ssn(b: &[u8], i: usize, s: &Span) -> bool {
    if s.groups != [3, 2, 4] || s.seps != [b'-', b'-'] || s.plus || at(b, i) == b'(' {
        return false;
    }
    let d = &s.digits;
    let area = prefix_num(d, 3);
    let group = prefix_num(d.get(3..).unwrap_or_default(), 2);
    let serial = prefix_num(d.get(5..).unwrap_or_default(), 4);
    area != 0 && area != 666 && area < 900 && group != 0 && serial != 0
}

/// Digit-only national ids with a check: French NIR (15 digits, key = 97 - first 13 mod 97),
/// Dutch BSN (9 digits, 11-check), Brazilian CPF (11 digits, two mod-11 check digits).
fn digit_id(b: &[u8], i: usize, s: &Span) -> bool {
    let d = &s.digits;
    let plain = s.groups.len() == 1 || s.seps.iter().all(|c| *c == b' ');
    if s.plus || s.paren {
        return false;
    }
    match d.len() {
        15 if plain && matches!(d.first(), Some(1 | 2)) => {
            let body = d.iter().take(13).fold(0u64, |acc, x| (acc * 10 + u64::from(*x)) % 97);
            97 - body == u64::from(prefix_num(d.get(13..).unwrap_or_default(), 2))
        }
        9 if s.groups.len() == 1 && named_before(b, i, BSN_WORDS) => {
            let sum: i64 = d.iter().enumerate().map(|(k, x)| if k == 8 { -i64::from(*x) } else { (9 - k as i64) * i64::from(*x) }).sum();
            sum % 11 == 0 && d.first() != Some(&0)
        }
        11 if s.groups.len() == 1 || s.seps == [b'.', b'.', b'-'] => cpf(d),
        _ => false,
    }
}

fn cpf(d: &[u8]) -> bool {
    if d.iter().all(|x| Some(x) == d.first()) {
        return false;
    }
    let check = |n: usize| {
        let sum: u32 = d.iter().take(n).enumerate().map(|(k, x)| (n as u32 + 1 - k as u32) * u32::from(*x)).sum();
        let r = (sum * 10) % 11;
        if r == 10 { 0 } else { r as u8 }
    };
    d.get(9) == Some(&check(9)) && d.get(10) == Some(&check(10))
}

/// A Spanish DNI: eight digits glued to their check letter.
fn digit_letter_id(b: &[u8], s: &Span) -> bool {
    if s.groups.len() != 1 || s.digits.len() != 8 || is_word(at(b, s.end + 1)) {
        return false;
    }
    let n = s.digits.iter().fold(0u32, |acc, x| acc * 10 + u32::from(*x));
    dni_letter(n) == Some(s.after)
}

pub(super) fn dni_letter(n: u32) -> Option<u8> {
    b"TRWAGMYFPDXBNJZSQVHLCKE".get((n % 23) as usize).copied()
}

/// Phone numbers: 7-15 digits, international (`+`, `00`), with an area code in parentheses,
/// or national digit groups; not dates, IP addresses, thousands or version-like groupings.
fn phone(b: &[u8], i: usize, s: &Span) -> bool {
    let n = s.digits.len();
    let g = &s.groups;
    if !(7..=15).contains(&n) || s.seps.contains(&b'/') {
        return false;
    }
    let only = |c: u8| !s.seps.is_empty() && s.seps.iter().all(|x| *x == c);
    // A date, alone or followed by a time ("1998-07-20 21:46").
    let looks_like_date = !s.plus && !s.paren && [[4, 2, 2], [2, 2, 4], [1, 2, 4], [2, 1, 4]].iter().any(|d| g.starts_with(d));
    let ip = only(b'.') && g.len() == 4 && g.iter().all(|x| *x <= 3);
    let first_zero = s.digits.first() == Some(&0);
    // Thousands never start with 0 ("1.234.567"; "0401.134.864" is a phone number).
    let thousands = only(b'.') && g.iter().skip(1).all(|x| *x == 3) && !first_zero;
    // 3-2-4 with dashes is how SSNs are written (invalid ones included), never a phone.
    let ssn_shaped = only(b'-') && g == &[3, 2, 4];
    if looks_like_date || ip || thousands || ssn_shaped {
        return false;
    }
    if s.plus {
        return n >= 8;
    }
    if s.paren {
        return n >= 9;
    }
    // The international call prefix "00" opens the first group ("001-591-...", not "0-08-...").
    if s.digits.starts_with(&[0, 0]) && g.first().is_some_and(|x| *x >= 2) {
        return n >= 10;
    }
    let groups_ok = g.iter().skip(1).all(|x| (2..=4).contains(x)) && g.first().is_some_and(|x| (2..=5).contains(x));
    match g.len() {
        // National: "0114 496 0123", "01 23 45 67 89", "591-341-7776", "080-9141-7776".
        // A national number with its trunk prefix 0 ("0114 496 0123", "01 23 45 67 89");
        // North American 3-3-4; without a trunk prefix ("22 499 86 38", "32-5881-3806") at
        // most 11 digits and not only pairs (a list of small numbers is not a phone number).
        3.. => {
            let national = groups_ok && n >= 9 && !only(b'.');
            let unprefixed = national && n <= 11 && g.iter().any(|x| *x >= 3);
            (first_zero && national) || unprefixed || g == &[3, 3, 4] || (g == &[1, 3, 3, 4] && s.digits.first() == Some(&1))
        }
        // "05678 123456": a trunk prefix and the subscriber.
        2 => first_zero && n >= 9 && g.iter().all(|x| *x >= 3),
        // Bare digits are a phone number only when named so ("call 5913417776").
        _ => (10..=12).contains(&n) && named_before(b, i, PHONE_WORDS),
    }
}
