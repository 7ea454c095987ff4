//! criguard: a CRI proxy that guards a node against resource pressure.
//!
//! The kubelet talks to criguard's socket as if it were containerd's; criguard
//! forwards every call to containerd ([`cri`]) and, standing in that path,
//! handles memory, disk and pid pressure at the runtime layer.

/// An enum whose variants are metric label values, each written as its
/// text: the label types of the modules that count (`kube::metrics`,
/// `gc::metrics`, `config::metrics`). Defined before the modules so
/// that each sees it.
macro_rules! label_values {
    ($(#[$m:meta])* pub enum $name:ident {
        $($(#[$vm:meta])* $v:ident => $text:literal,)+
    }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
        pub enum $name {
            $($(#[$vm])* $v,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)+];

            /// The label value.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$v => $text,)+
                }
            }
        }

        impl ::prometheus_client::encoding::EncodeLabelValue for $name {
            fn encode(
                &self,
                e: &mut ::prometheus_client::encoding::LabelValueEncoder,
            ) -> std::fmt::Result {
                std::fmt::Write::write_str(e, self.as_str())
            }
        }
    };
}

pub mod accept;
pub mod admin;
pub mod backoff;
pub mod cgroup;
pub mod clock;
pub mod config;
pub mod cri;
pub mod eviction;
pub mod gc;
pub mod handoff;
pub mod intercept;
pub mod kube;
#[cfg(test)]
mod layers;
pub mod limits;
pub mod listen;
pub mod lock;
pub mod lograte;
pub mod metrics;
pub mod model;
pub mod nri;
pub mod oom;
pub mod pidfd;
pub mod quantity;
pub mod runtime;
pub mod sdnotify;
pub mod signals;
pub mod statefile;
