//! The map the data plane's snapshot is made of: a shared base and a small layer of the changes
//! made since, so that the next snapshot (a clone with one change) copies the layer, not every
//! entry, while a lookup stays two probes of flat hash tables.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::Arc;

use plugin_sdk::FastMap;

/// Entries the layer may hold before it is folded into a new base, at least: with few entries
/// folding is cheap anyway.
const MIN_LAYER: usize = 64;

/// A base shared by every clone (`Arc`) and a layer of the entries changed since (`None`: removed).
/// The layer is folded into a new base once it holds more than `max(64, 4 * sqrt(base))`
/// entries: a clone copies at most that many entries (about 1,300 at 100,000), and the copy of
/// the base a fold makes is spread over as many changes.
#[derive(Debug, Clone)]
pub struct LayeredMap<K, V> {
    base: Arc<FastMap<K, V>>,
    layer: FastMap<K, Option<V>>,
    len: usize,
}

impl<K, V> Default for LayeredMap<K, V> {
    fn default() -> Self {
        LayeredMap {
            base: Arc::new(FastMap::default()),
            layer: FastMap::default(),
            len: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, V: Clone> LayeredMap<K, V> {
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get_key_value(key).map(|(_, v)| v)
    }

    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.layer.get_key_value(key) {
            Some((k, Some(v))) => Some((k, v)),
            Some((_, None)) => None,
            None => self.base.get_key_value(key),
        }
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.get(&key).cloned();
        if old.is_none() {
            self.len += 1;
        }
        self.layer.insert(key, Some(value));
        self.fold_if_large();
        old
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let old = self.get(key).cloned()?;
        self.len -= 1;
        if self.base.contains_key(key) {
            self.layer.insert(key.to_owned(), None);
        } else {
            self.layer.remove(key);
        }
        self.fold_if_large();
        Some(old)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let layer = &self.layer;
        layer
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
            .chain(
                self.base
                    .iter()
                    .filter(move |(k, _)| !layer.contains_key(*k)),
            )
    }

    fn fold_if_large(&mut self) {
        let limit = MIN_LAYER.max(4 * (self.base.len() as f64).sqrt() as usize);
        if self.layer.len() <= limit {
            return;
        }
        let mut base = FastMap::clone(&self.base);
        for (k, v) in self.layer.drain() {
            match v {
                Some(v) => {
                    base.insert(k, v);
                }
                None => {
                    base.remove(&k);
                }
            }
        }
        self.base = Arc::new(base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Random inserts and removes, with clones kept along the way: each clone keeps what it
    /// held, and the map always agrees with a plain `HashMap` given the same operations.
    #[test]
    fn agrees_with_a_hash_map_and_clones_stay_put() {
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut map: LayeredMap<u64, u64> = LayeredMap::default();
        let mut want: HashMap<u64, u64> = HashMap::new();
        let mut kept: Vec<(LayeredMap<u64, u64>, HashMap<u64, u64>)> = Vec::new();
        for i in 0..20_000u64 {
            let key = next() % 3_000;
            if next() % 3 == 0 {
                assert_eq!(map.remove(&key), want.remove(&key));
            } else {
                assert_eq!(map.insert(key, i), want.insert(key, i));
            }
            assert_eq!(map.len(), want.len());
            if i % 2_500 == 0 {
                kept.push((map.clone(), want.clone()));
            }
        }
        kept.push((map, want));
        for (map, want) in &kept {
            assert_eq!(map.len(), want.len());
            let got: HashMap<u64, u64> = map.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(&got, want);
            for k in 0..3_000 {
                assert_eq!(map.get(&k), want.get(&k));
            }
        }
    }

    #[test]
    fn string_keys_are_found_by_str() {
        let mut map: LayeredMap<String, u8> = LayeredMap::default();
        map.insert("a".into(), 1);
        assert_eq!(map.get("a"), Some(&1));
        assert_eq!(map.get_key_value("a").map(|(k, _)| k.as_str()), Some("a"));
        assert_eq!(map.remove("a"), Some(1));
        assert!(map.get("a").is_none());
        assert!(map.is_empty());
    }
}
