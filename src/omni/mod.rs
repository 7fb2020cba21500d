pub mod join;
