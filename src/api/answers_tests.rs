//! Tests of the answer budget (`answers.rs`).

use super::*;

const MIB: u64 = 1 << 20;

fn leaked(total: u64) -> &'static AnswerBudget {
    Box::leak(Box::new(AnswerBudget::new(total)))
}

#[test]
fn a_client_past_its_share_is_refused_and_others_are_not() {
    let budget = leaked(64 * MIB);
    let nobody = Holder::Uid(65534);
    let first = budget.take(nobody, 10 * MIB).unwrap();
    let second = budget.take(nobody, 6 * MIB).unwrap();
    assert_eq!(budget.stats().held, 16 * MIB);
    // At its share: refused before running, and for one more byte.
    assert!(matches!(budget.admit(nobody), Err(ApiError::Busy(m)) if m.contains("share")));
    assert!(budget.take(nobody, SMALL_ANSWER + 1).is_err());
    // Small answers always go.
    let small = budget.take(nobody, SMALL_ANSWER).unwrap();
    // Another user is not held back by nobody's answers.
    let daemon = Holder::Uid(1);
    assert!(budget.admit(daemon).is_ok());
    let theirs = budget.take(daemon, 12 * MIB).unwrap();
    drop((first, second, small, theirs));
    let stats = budget.stats();
    assert_eq!((stats.held, stats.clients, stats.refused), (0, 0, 2));
    assert_eq!(stats.peak, 28 * MIB + SMALL_ANSWER);
    assert!(budget.admit(nobody).is_ok(), "given back when dropped");
}

#[test]
fn a_first_answer_may_pass_the_share_but_not_the_room() {
    let budget = leaked(64 * MIB);
    let big = budget.take(Holder::Uid(1000), 30 * MIB).unwrap();
    let other = Holder::Addr("192.0.2.7".parse().unwrap());
    let room = 64 * MIB - Limits::of(64 * MIB).root_reserve;
    assert!(budget.take(other, room - 30 * MIB + 1).is_err());
    let fits = budget.take(other, room - 30 * MIB).unwrap();
    // Unprivileged clients have used their room; root has its reserve.
    assert!(budget.admit(Holder::Uid(1001)).is_err());
    assert!(budget.admit(Holder::Uid(0)).is_ok());
    let root = budget.take(Holder::Uid(0), 16 * MIB).unwrap();
    assert!(
        budget.take(Holder::Uid(0), MIB).is_err(),
        "the budget is full"
    );
    assert!(budget.take(Holder::Uid(0), SMALL_ANSWER).is_ok());
    drop((big, fits, root));
    // An empty budget gives root its answer whatever its size.
    assert!(budget.take(Holder::Uid(0), 100 * MIB).is_ok());
}

#[test]
fn a_charged_answer_keeps_its_size_and_gives_back_when_dropped() {
    let budget = leaked(64 * MIB);
    let charge = budget.take(Holder::Uid(1), MIB).unwrap();
    let body = Charged {
        body: Body::from(vec![7u8; 3000]),
        _charge: charge,
    };
    assert_eq!(body.size_hint().exact(), Some(3000));
    assert!(!body.is_end_stream());
    assert_eq!(budget.stats().held, MIB);
    drop(body);
    assert_eq!(budget.stats().held, 0);
}

#[test]
fn holders_are_uids_else_addresses() {
    let client = |addr: &str, uid| Client {
        addr: addr.parse().unwrap(),
        uid,
    };
    assert_eq!(Holder::of(None), Holder::InProcess);
    assert_eq!(
        Holder::of(Some(&client("127.0.0.1:4000", Some(7)))),
        Holder::of(Some(&client("[::1]:5000", Some(7))))
    );
    assert_eq!(
        Holder::of(Some(&client("[::ffff:10.0.0.1]:1", None))),
        Holder::of(Some(&client("10.0.0.1:2", None)))
    );
    assert!(Holder::Uid(0).privileged() && !Holder::Uid(1).privileged());
    let mut gzip = HeaderMap::new();
    gzip.insert(header::ACCEPT_ENCODING, "deflate, GZip".parse().unwrap());
    assert!(accepts_gzip(&gzip) && !accepts_gzip(&HeaderMap::new()));
}
