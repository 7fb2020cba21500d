//! The protobuf codec of our gRPC stubs (client and in-memory server): tonic's prost codec with
//! small starting buffers.
//!
//! tonic gives every call a buffer of 8 KiB to encode its request and another to decode the answer,
//! whatever their size. Our messages are a few hundred bytes (one resource; a listing streams one
//! resource per message), and a burst of a thousand new requests has about as many calls in flight
//! at once: up to 16 MiB of mostly empty buffers, whose holes the heap keeps after the burst
//! (measured: the provider's live heap peaks at the start of such a burst, 27 MiB, with hundreds
//! of these buffers in it). A buffer that starts at 1 KiB grows when a message needs more.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Where each call's buffers start.
const BUFFER_BYTES: usize = 1024;
/// tonic's default: how much a streaming encoder gathers before it yields.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// tonic's `ProstCodec`, with [`BUFFER_BYTES`] buffers. Named by `build.rs` as the codec of the
/// generated stubs.
#[derive(Debug, Clone, Default)]
pub struct SmallBufferCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Codec for SmallBufferCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstDecoder::new(BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD))
    }
}
