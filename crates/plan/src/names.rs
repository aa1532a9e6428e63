//! The names the files use: what the flags gave, else what the bench measured, else a placeholder
//! that each file carrying it marks as not measured.

use crate::arith::{Names, Unmeasured};
use crate::measure::Measurement;
use crate::{PlanError, Target};

/// What the operator gave on the command line; `None` and empty lists take the measured value.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Given {
    pub model: Option<String>,
    pub served_model: Option<String>,
    pub hf_model: Option<String>,
    pub namespace: String,
    pub route: Option<String>,
    pub listen: Option<String>,
    pub upstreams: Vec<String>,
    pub api_base: Option<String>,
    pub class: String,
    pub max_model_len: Option<u32>,
    pub max_num_batched_tokens: Option<u32>,
}

/// Where Spillway listens when `--listen` is not given.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8080";

/// The names for `replicas` replicas, from `given` and the measurement (whose bench stood in front
/// of `measured_replicas` replicas).
pub fn names(
    given: Given,
    m: &Measurement,
    replicas: u32,
    measured_replicas: u32,
) -> Result<Names, PlanError> {
    let Some(model) = given.model.or_else(|| m.model.clone()) else {
        return Err(PlanError::Input(
            "--model: name the model (a bench result names it; figures do not)".into(),
        ));
    };
    let served_model = given.served_model.unwrap_or_else(|| model.clone());
    let route = given.route.unwrap_or_else(|| {
        model
            .to_ascii_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>()
            .trim_matches('-')
            .to_owned()
    });
    let mut unmeasured = Vec::new();
    let mut note = |targets: &[Target], note: String| {
        unmeasured.push(Unmeasured {
            targets: targets.to_vec(),
            note,
        })
    };

    let upstreams = if !given.upstreams.is_empty() {
        given.upstreams
    } else {
        // One replica measured directly is a replica's URL; a bench in front of several went
        // through whatever balanced them, whose URL is not a replica's.
        let measured = m.target_url.as_ref().filter(|_| measured_replicas == 1);
        let known = usize::from(measured.is_some());
        let unknown = (replicas as usize).saturating_sub(known);
        if let Some(url) = measured {
            note(
                &[Target::Spillway],
                format!(
                    "replicas: {url} is the URL the bench measured; if that was a gateway or a Service rather than one replica, replace it (--upstream URL per replica)"
                ),
            );
        }
        if unknown > 0 {
            let what = match &m.target_url {
                Some(url) if known == 0 => format!(
                    "the bench measured {url}, in front of {measured_replicas} replicas, not the replicas themselves"
                ),
                Some(_) => "the bench measured one replica".to_owned(),
                None => "no bench named them".to_owned(),
            };
            note(
                &[Target::Spillway],
                format!(
                    "replicas: {unknown} placeholder URL(s) http://replica-N.invalid:8000 ({what}); give each replica's base URL with --upstream"
                ),
            );
        }
        measured
            .cloned()
            .into_iter()
            .chain(
                (known..replicas.min(1000) as usize)
                    .map(|i| format!("http://replica-{}.invalid:8000", i + 1)),
            )
            .collect()
    };
    let listen = given.listen.unwrap_or_else(|| {
        note(
            &[Target::Spillway],
            format!(
                "listen: {DEFAULT_LISTEN} is the default; a bench measures the backend, not where the gateway will listen (--listen)"
            ),
        );
        DEFAULT_LISTEN.to_owned()
    });
    let hf_model = given.hf_model.unwrap_or_else(|| {
        note(
            &[Target::Vllm, Target::Kserve],
            format!(
                "the model vLLM loads is written as the served name {served_model:?}: a bench knows the name it sent, not the Hugging Face id or storage URI behind it (--hf-model)"
            ),
        );
        served_model.clone()
    });
    let api_base = given.api_base.unwrap_or_else(|| {
        let base = format!("http://{route}.{}.svc.cluster.local/v1", given.namespace);
        note(
            &[Target::Litellm],
            format!("api_base: {base} assumes the gateway is the in-cluster Service named after the route (--api-base)"),
        );
        base
    });
    let max_model_len = given.max_model_len.or(m.max_model_len);
    if given.max_model_len.is_none()
        && let Some(len) = m.max_model_len
    {
        note(
            &[Target::Vllm, Target::Kserve],
            format!("--max-model-len {len}: the context the measured server published in /v1/models"),
        );
    }
    Ok(Names {
        model,
        served_model,
        hf_model,
        namespace: given.namespace,
        route,
        listen,
        upstreams,
        api_base,
        class: given.class,
        max_model_len,
        max_num_batched_tokens: given.max_num_batched_tokens,
        unmeasured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::Figures;

    fn measured(url: Option<&str>) -> Measurement {
        let mut m = Measurement::from_figures(
            &Figures {
                c_safe: 4,
                throughput: 2.0,
                ttft_p99: None,
                itl_p99: None,
                e2e_p99: None,
            },
            1,
        )
        .unwrap();
        m.model = Some("m".into());
        m.target_url = url.map(str::to_owned);
        m.max_model_len = Some(4096);
        m
    }

    fn given() -> Given {
        Given {
            namespace: "default".into(),
            class: "interactive".into(),
            ..Given::default()
        }
    }

    #[test]
    fn one_measured_replica_gives_its_url_and_the_rest_are_marked_placeholders() {
        let n = names(given(), &measured(Some("http://10.0.0.5:8000")), 2, 1).unwrap();
        assert_eq!(
            n.upstreams,
            ["http://10.0.0.5:8000", "http://replica-2.invalid:8000"]
        );
        assert_eq!(n.max_model_len, Some(4096));
        let notes: Vec<&str> = n.unmeasured.iter().map(|u| u.note.as_str()).collect();
        assert!(
            notes.iter().any(|t| t.contains("1 placeholder URL(s)")),
            "{notes:#?}"
        );
        assert!(
            notes
                .iter()
                .any(|t| t.starts_with("listen: 0.0.0.0:8080 is the default")),
            "{notes:#?}"
        );
        assert!(
            notes.iter().any(|t| t.contains("not the Hugging Face id")),
            "{notes:#?}"
        );
    }

    #[test]
    fn a_bench_through_a_balancer_names_no_replica() {
        let n = names(given(), &measured(Some("http://gw:8080")), 2, 2).unwrap();
        assert_eq!(
            n.upstreams,
            ["http://replica-1.invalid:8000", "http://replica-2.invalid:8000"]
        );
        assert!(
            n.unmeasured
                .iter()
                .any(|u| u.note.contains("measured http://gw:8080, in front of 2 replicas")),
            "{:#?}",
            n.unmeasured
        );
    }

    #[test]
    fn what_the_flags_give_is_not_marked() {
        let g = Given {
            upstreams: vec!["http://a:1".into()],
            listen: Some("0.0.0.0:9000".into()),
            hf_model: Some("org/m".into()),
            api_base: Some("http://gw/v1".into()),
            max_model_len: Some(2048),
            ..given()
        };
        let n = names(g, &measured(Some("http://10.0.0.5:8000")), 1, 1).unwrap();
        assert!(n.unmeasured.is_empty(), "{:#?}", n.unmeasured);
        assert_eq!(n.max_model_len, Some(2048));
    }
}
