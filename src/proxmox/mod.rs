//! Typed Proxmox VE client.
