use super::*;

fn kinds(text: &str) -> Vec<&'static str> {
    scan(text).kinds().map(Kind::label).collect()
}

#[track_caller]
fn finds(kind: Kind, examples: &[&str]) {
    for e in examples {
        let text = format!("Please look at this: {e} and tell me what you think.");
        assert!(scan(&text).has(kind), "{:?} not found in {text:?} (found {:?})", kind.label(), kinds(&text));
    }
}

#[track_caller]
fn clean(examples: &[&str]) {
    for e in examples {
        let text = format!("Please look at this: {e} and tell me what you think.");
        assert!(!scan(&text).any(), "{text:?}: found {:?}", kinds(&text));
    }
}

#[test]
fn provider_keys_are_found_by_prefix_length_and_alphabet() {
    finds(Kind::ApiKey, &[
        "sk-proj-Ab3dEf5hIj7kLm9nOp1qRs3tUv5wXy7zAb9cDe1fGh3",
        "sk-ant-api03-Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0GfEdCbA9z8y7x6w5v4u3t2s1",
        "AKIAIOSFODNN7EXAMPLE",
        "ghp_1a2B3c4D5e6F7g8H9i0J1k2L3m4N5o6P7q8R",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH",
        "glpat-Ab1Cd2Ef3Gh4Ij5Kl6Mn",
        "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh",
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
        "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG",
    ]);
}

#[test]
fn names_that_look_like_keys_are_not() {
    clean(&[
        "sk-learn",
        "sk-this-is-a-long-hyphenated-name-without-digits",
        "api_key = os.environ[\"OPENAI_API_KEY\"]",
        "ghp_token",
        "AKIA is a prefix",
        "AKIAIOSFODNN7EXAMPLE1234",
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "550e8400-e29b-41d4-a716-446655440000",
        "eyJhbGciOiJIUzI1NiJ9 alone",
    ]);
}

#[test]
fn private_key_blocks_are_found() {
    finds(Kind::PrivateKey, &["\n-----BEGIN RSA PRIVATE KEY-----\nMIIEow...", "-----BEGIN OPENSSH PRIVATE KEY-----", "-----BEGIN PRIVATE KEY-----"]);
    clean(&["-----BEGIN PUBLIC KEY-----", "-----BEGIN CERTIFICATE-----"]);
}

#[test]
fn card_numbers_need_an_issuer_and_the_luhn_check() {
    finds(Kind::Card, &["4111111111111111", "4111 1111 1111 1111", "5500-0000-0000-0004", "378282246310005", "3782 822463 10005", "6011837783533747", "213153374068120"]);
    clean(&["4111111111111112", "1234 5678 9012 3456", "9111111111111111", "4111-1111"]);
}

#[test]
fn ibans_need_their_country_length_and_checksum() {
    finds(Kind::Iban, &["GB82WEST12345698765432", "GB82 WEST 1234 5698 7654 32", "DE89370400440532013000", "NL22AURA6360837783", "BR5615000806360837783533740HS"]);
    clean(&["GB82WEST12345698765433", "DE8937040044053201300", "XX82WEST12345698765432"]);
}

#[test]
fn emails_need_a_dotted_domain() {
    finds(Kind::Email, &["jane.doe+ops@example.co.uk", "a@b.io"]);
    clean(&["@app.route('/')", "user@localhost", "follow @kvroute", "x@1.2"]);
}

#[test]
fn phone_numbers_in_many_national_formats() {
    finds(Kind::Phone, &[
        "(591)341-7776",
        "+44(0)115 4960914",
        "+49 (0) 9141 777631",
        "+33 1 83 41 77 76",
        "+34842 91 41 77",
        "+39 0925141776",
        "080-9141-7776",
        "001-591-341-7776x123",
        "591.341.7776",
        "0114 496 0123",
        "01 23 45 67 89",
        "1-591-341-7776",
    ]);
    finds(Kind::Phone, &["call me on 5913417776"]);
}

#[test]
fn dates_addresses_amounts_and_versions_are_not_phones() {
    clean(&[
        "2024-03-15",
        "15.03.2024",
        "03/15/2024 12:30",
        "1998-07-20 21:46:14",
        "192.168.100.200",
        "1.234.567",
        "1,234,567.89",
        "v1.2.3",
        "978-3-16-148410-0",
        "0-08-938820-8",
        "order 5913417776",
        "3 4 5 6 7 8 9",
        "42",
    ]);
}

#[test]
fn national_ids_with_their_checks() {
    finds(Kind::NationalId, &[
        "500-04-6387",
        "AB 12 34 56 C",
        "AB123456C",
        "12345678Z",
        "X1234567L",
        "RSSMRA85T10A562S",
        "185057800608491",
        "70301518V",
        "614.538.520-00",
        "BSN 111222333",
        "529.982.247-25",
        "52998224725",
    ]);
    clean(&[
        "000-12-3456",
        "666-12-3456",
        "912-12-3456",
        "ZZ 12 34 56 C",
        "12345678A",
        "RSSMRA85T10A562T",
        "111222333",
        "52998224726",
        "11111111111",
    ]);
}

#[test]
fn findings_are_kinds_only_and_positions_do_not_matter() {
    let text = "mail ops@example.com, card 4111111111111111, at the end AKIAIOSFODNN7EXAMPLE";
    let f = scan(text);
    assert_eq!(f.kinds().collect::<Vec<_>>(), vec![Kind::ApiKey, Kind::Card, Kind::Email]);
    assert!(!scan("").any());
    assert!(!scan("plain prose about routing and caches, nothing else").any());
    // Multi-byte text around a finding and at the very end.
    assert!(scan("héllo ☃ 4111111111111111").has(Kind::Card));
    assert!(!scan("ends with a digit 4").any());
    assert_eq!(Kind::from_label("iban"), Some(Kind::Iban));
}

#[test]
fn a_body_is_read_in_every_string_not_only_the_messages() {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],
        "tools":[{"type":"function","function":{"name":"f","description":"auth with AKIAIOSFODNN7EXAMPLE"}}],
        "metadata":{"owner":"jane.doe@example.com"}}"#;
    let f = scan_json(body).unwrap();
    assert!(f.has(Kind::ApiKey) && f.has(Kind::Email), "{:?}", f.kinds().collect::<Vec<_>>());
    // Escapes are decoded before the scan: a key right after "\n" is still at a word start.
    assert!(scan_json(br#"{"prompt":"key:\nAKIAIOSFODNN7EXAMPLE"}"#).unwrap().has(Kind::ApiKey));
    assert!(!scan_json(br#"{"prompt":"plain"}"#).unwrap().any());
    assert_eq!(scan_json(b"not json"), None);
}
