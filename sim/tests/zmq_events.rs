//! KV events over real ZMQ: a subscriber that only sees the wire must end up holding
//! exactly the worker's cached block set, via live messages, a full replay into a fresh
//! subscriber, and replay-driven repair of dropped messages.

mod common;

use common::*;

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len).map(|i| seed * 100_000 + i).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_into_fresh_subscriber_reproduces_cache_and_repairs_drops() {
    // 40 blocks: the workload below overflows it, so evictions (BlockRemoved) happen too.
    let cluster = start(1, 40).await;
    let layout = cluster.layout[0].clone();
    let http = layout.http.clone();
    let (events, replay) = (layout.kv_events.unwrap(), layout.kv_replay.unwrap());
    let client = reqwest::Client::new();
    let ctx = zmq::Context::new();

    for i in 0..12 {
        complete(&client, &http, prompt(i % 5, 100 + i * 7), 3).await;
    }
    let st = state(&client, &http).await;
    let upto = st["publisher"]["next_seq"].as_u64().unwrap();
    assert!(upto > 0);
    let mut fresh = Mirror::default();
    fresh.replay(&ctx, &replay);
    assert_eq!(fresh.next_seq, upto, "replay returns every buffered batch");
    assert_eq!(fresh.blocks, engine_blocks(&st), "replayed events reproduce the cache");
    assert!(st["stats"]["prefix_cache_hits"].as_u64().unwrap() > 0);

    // Live subscriber from here on, with half the messages dropped on the wire.
    let sub = Subscriber::connect(&ctx, &events);
    let mut live = fresh;
    let r = client.post(format!("{http}/sim/fault")).body(r#"{"drop_fraction": 0.5}"#).send().await.unwrap();
    assert!(r.status().is_success());
    for i in 0..20 {
        complete(&client, &http, prompt(i % 7 + 10, 60 + i * 5), 2).await;
        if i % 5 == 4 {
            let upto = state(&client, &http).await["publisher"]["next_seq"].as_u64().unwrap();
            let (ctx2, replay2) = (ctx.clone(), replay.clone());
            live = tokio::task::block_in_place(|| {
                sub.sync(&mut live, &ctx2, &replay2, upto);
                live
            });
        }
    }
    let st = state(&client, &http).await;
    assert!(st["publisher"]["dropped"].as_u64().unwrap() > 0, "drops happened");
    assert_eq!(live.blocks, engine_blocks(&st), "replay repaired the dropped batches");

    // Restart: sequence numbers start over and the cache is empty.
    client.post(format!("{http}/sim/fault")).body(r#"{"restart": true, "drop_fraction": 0.0}"#).send().await.unwrap();
    let st = state(&client, &http).await;
    assert!(engine_blocks(&st).is_empty());
    complete(&client, &http, prompt(99, 64), 1).await;
    let mut after = Mirror::default();
    tokio::task::block_in_place(|| after.replay(&ctx, &replay));
    let st = state(&client, &http).await;
    assert_eq!(after.blocks, engine_blocks(&st));
    assert_eq!(after.next_seq, st["publisher"]["next_seq"].as_u64().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_engine_announces_blocks_it_never_holds() {
    let cluster = start(1, 40).await;
    let layout = cluster.layout[0].clone();
    let (http, replay) = (layout.http.clone(), layout.kv_replay.unwrap());
    let client = reqwest::Client::new();
    let r = client.post(format!("{http}/sim/fault")).body(r#"{"flood_blocks": 2500}"#).send().await.unwrap();
    assert!(r.status().is_success());
    let r = client.post(format!("{http}/sim/fault")).body(r#"{"flood_blocks": 100000000}"#).send().await.unwrap();
    assert_eq!(r.status(), 400, "a flood past the bound is refused");
    // Sent in the background: three batches (1,000, 1,000, 500).
    let mut st = state(&client, &http).await;
    for _ in 0..100 {
        if st["publisher"]["next_seq"].as_u64() == Some(3) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        st = state(&client, &http).await;
    }
    assert_eq!(st["publisher"]["next_seq"], 3, "{st}");
    assert_eq!(st["faults"]["flooded_blocks"], 2500, "{st}");
    assert!(engine_blocks(&st).is_empty(), "the engine holds none of them");
    let mut mirror = Mirror::default();
    let ctx = zmq::Context::new();
    tokio::task::block_in_place(|| mirror.replay(&ctx, &replay));
    assert_eq!(mirror.blocks.len(), 2500, "every announced block is distinct");
}
