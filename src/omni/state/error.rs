//! What a State call was about and what went wrong, sorted by what the caller can do about it.

use tonic::Code;

use crate::omni::proto::cosi::resource as pb;
use crate::omni::resources::Kind;

/// `namespace/type/id`, for error messages and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceRef {
    pub namespace: String,
    pub resource_type: String,
    pub id: String,
}

impl ResourceRef {
    pub fn new(
        namespace: impl Into<String>,
        resource_type: impl Into<String>,
        id: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            resource_type: resource_type.into(),
            id: id.into(),
        }
    }

    pub fn of<S>(kind: &Kind<S>, id: &str) -> Self {
        Self::new(&*kind.namespace, &*kind.resource_type, id)
    }

    pub fn from_metadata(md: &pb::Metadata) -> Self {
        Self::new(&md.namespace, &md.r#type, &md.id)
    }
}

impl std::fmt::Display for ResourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.id.is_empty() {
            write!(f, "{}({})", self.resource_type, self.namespace)
        } else {
            write!(f, "{}({})/{}", self.resource_type, self.namespace, self.id)
        }
    }
}

/// What went wrong talking to the State service, by what the caller can do about it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StateError {
    #[error("{what} not found")]
    NotFound { what: ResourceRef },
    /// Version conflict (someone else wrote first) or pending finalizers on destroy.
    #[error("{what}: conflict: {message}")]
    Conflict { what: ResourceRef, message: String },
    #[error("{what} already exists")]
    AlreadyExists { what: ResourceRef },
    #[error(
        "{what}: permission denied by Omni: {message} (is the key an infra-provider key for this provider ID?)"
    )]
    PermissionDenied { what: ResourceRef, message: String },
    #[error("{what}: Omni rejected the request signature: {message} (check the key and the clock)")]
    Unauthenticated { what: ResourceRef, message: String },
    #[error("{what}: invalid request: {message}")]
    InvalidArgument { what: ResourceRef, message: String },
    #[error("{what}: not supported by this Omni: {message}")]
    Unimplemented { what: ResourceRef, message: String },
    #[error("{what}: cannot reach Omni: {message}")]
    Transport { what: ResourceRef, message: String },
    #[error("{what}: {message}")]
    Other { what: ResourceRef, message: String },
    #[error("{what}: spec does not decode: {message}")]
    Decode { what: ResourceRef, message: String },
    /// Not sent: this replica does not hold the leader lease (see [`crate::fence`]).
    #[error("{what}: {source}")]
    Fenced {
        what: ResourceRef,
        source: crate::fence::Fenced,
    },
}

impl StateError {
    pub fn from_status(what: ResourceRef, status: &tonic::Status) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::NotFound => Self::NotFound { what },
            Code::FailedPrecondition => Self::Conflict { what, message },
            Code::AlreadyExists => Self::AlreadyExists { what },
            Code::PermissionDenied => Self::PermissionDenied { what, message },
            Code::Unauthenticated => Self::Unauthenticated { what, message },
            Code::InvalidArgument => Self::InvalidArgument { what, message },
            Code::Unimplemented => Self::Unimplemented { what, message },
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
                Self::Transport { what, message }
            }
            _ => Self::Other {
                what,
                message: format!("{:?}: {message}", status.code()),
            },
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_map_to_typed_errors() {
        let what = ResourceRef::new("infra-provider", "MachineRequests.omni.sidero.dev", "r1");
        let e = StateError::from_status(what.clone(), &tonic::Status::not_found("x"));
        assert!(e.is_not_found());
        assert!(
            e.to_string()
                .contains("MachineRequests.omni.sidero.dev(infra-provider)/r1")
        );
        let e =
            StateError::from_status(what.clone(), &tonic::Status::failed_precondition("version"));
        assert!(e.is_conflict());
        let e = StateError::from_status(what, &tonic::Status::permission_denied("nope"));
        assert!(matches!(e, StateError::PermissionDenied { .. }));
    }
}
