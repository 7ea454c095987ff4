//! Scraping criguard's metrics endpoint the way Prometheus does.

use std::collections::HashMap;
use std::io::{Read, Write};

/// A loopback port nobody listens on right now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One sample: metric name, labels, value.
pub type Sample = (String, HashMap<String, String>, f64);

/// Parses exposition text into samples.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (head, value) = l.rsplit_once(' ').unwrap();
            let (name, labels) = match head.split_once('{') {
                Some((n, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split(',')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                        .collect();
                    (n.to_owned(), labels)
                }
                None => (head.to_owned(), HashMap::new()),
            };
            (name, labels, value.parse().unwrap())
        })
        .collect()
}

/// GET /metrics on 127.0.0.1:`port`; the body.
pub fn scrape(port: u16) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
    out.split_once("\r\n\r\n").unwrap().1.to_owned()
}

/// The value of the sample `name` whose labels include all of `labels`.
pub fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples.iter().find_map(|(n, l, v)| {
        (n == name
            && labels
                .iter()
                .all(|(k, want)| l.get(*k).is_some_and(|got| got == want)))
        .then_some(*v)
    })
}

/// One scrape of 127.0.0.1:`port`: the value of `name` with `labels`.
pub fn scraped(port: u16, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    value(&parse(&scrape(port)), name, labels)
}
