//! A safetensors model in one file or in shards listed by `model.safetensors.index.json`.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

use super::{check_shape, SafetensorInfo, SafetensorsFile};
use crate::error::{IoError, Result};
use crate::storage::{os_error, Storage};

/// Name of the index of a sharded Hugging Face checkpoint.
pub const INDEX_FILE_NAME: &str = "model.safetensors.index.json";
/// Name of a single-file Hugging Face checkpoint.
pub const SINGLE_FILE_NAME: &str = "model.safetensors";

/// The tensors of a model, whether stored in one safetensors file or sharded.
///
/// Each shard is memory-mapped once; a tensor is looked up in the shard the index names.
#[derive(Debug)]
pub struct SafetensorsModel {
    shards: Vec<SafetensorsFile>,
    /// Tensor name → index into `shards`, in sorted name order for deterministic listing.
    shard_of: HashMap<String, usize>,
    names: Vec<String>,
}

impl SafetensorsModel {
    /// Opens a model from a directory (its `model.safetensors.index.json`, else its
    /// `model.safetensors`), an index file (`*.json`), or a single `.safetensors` file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsModel> {
        Self::open_with(path.as_ref(), Storage::map)
    }

    /// Opens a model to run it: as [`SafetensorsModel::open`], but large files are read into
    /// memory backed by 2 MiB pages where the OS offers them (see `storage.rs`;
    /// `LUMINAL_MMAP=1` maps instead).
    pub fn load(path: impl AsRef<Path>) -> Result<SafetensorsModel> {
        Self::open_with(path.as_ref(), Storage::load)
    }

    fn open_with(path: &Path, read: fn(&Path) -> Result<Storage>) -> Result<SafetensorsModel> {
        if path.is_dir() {
            let index = path.join(INDEX_FILE_NAME);
            if index.is_file() {
                return Self::open_index_with(&index, read);
            }
            let file = SafetensorsFile::open_with(&path.join(SINGLE_FILE_NAME), read)?;
            return Self::from_file(file);
        }
        if path.extension().is_some_and(|ext| ext == "json") {
            return Self::open_index_with(path, read);
        }
        Self::from_file(SafetensorsFile::open_with(path, read)?)
    }

    /// Wraps a single file.
    pub fn from_file(file: SafetensorsFile) -> Result<SafetensorsModel> {
        let mut names: Vec<String> = file.names().map(str::to_string).collect();
        names.sort();
        let shard_of = names.iter().map(|n| (n.clone(), 0)).collect();
        Ok(SafetensorsModel {
            shards: vec![file],
            shard_of,
            names,
        })
    }

    /// Opens a sharded model from its index: `{"metadata": …, "weight_map": {tensor: file}}`,
    /// file names relative to the index's directory.
    pub fn open_index(index_path: impl AsRef<Path>) -> Result<SafetensorsModel> {
        Self::open_index_with(index_path.as_ref(), Storage::map)
    }

    fn open_index_with(
        index_path: &Path,
        read: fn(&Path) -> Result<Storage>,
    ) -> Result<SafetensorsModel> {
        let text = std::fs::read_to_string(index_path).map_err(|e| os_error(index_path, e))?;
        let dir = index_path.parent().unwrap_or(Path::new("."));
        Self::from_index_json_with(&text, dir, read).map_err(|e| e.in_file(index_path))
    }

    /// Builds a sharded model from index JSON text, resolving shard files in `dir`.
    pub fn from_index_json(text: &str, dir: &Path) -> Result<SafetensorsModel> {
        Self::from_index_json_with(text, dir, Storage::map)
    }

    fn from_index_json_with(
        text: &str,
        dir: &Path,
        read: fn(&Path) -> Result<Storage>,
    ) -> Result<SafetensorsModel> {
        let bad = |reason: String| IoError::BadIndex { reason };
        let json: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let weight_map = json
            .get("weight_map")
            .and_then(serde_json::Value::as_object)
            .ok_or_else(|| bad("no weight_map object".into()))?;

        let mut shard_files: Vec<String> = Vec::new();
        let mut shard_index: HashMap<String, usize> = HashMap::new();
        let mut shard_of = HashMap::with_capacity(weight_map.len());
        for (tensor, file) in weight_map {
            let file = file
                .as_str()
                .ok_or_else(|| bad(format!("weight_map entry of {tensor} is not a file name")))?;
            let next = shard_files.len();
            let shard = *shard_index.entry(file.to_string()).or_insert(next);
            if shard == next {
                check_shard_name(file)?;
                shard_files.push(file.to_string());
            }
            shard_of.insert(tensor.clone(), shard);
        }

        let mut shards = Vec::with_capacity(shard_files.len());
        for file in &shard_files {
            shards.push(SafetensorsFile::open_with(&dir.join(file), read)?);
        }
        let mut names: Vec<String> = shard_of.keys().cloned().collect();
        names.sort();
        for name in &names {
            let shard = shard_of[name];
            if !shards[shard].contains(name) {
                return Err(bad(format!(
                    "weight_map puts tensor {name} in {}, which does not contain it",
                    shard_files[shard]
                )));
            }
        }
        Ok(SafetensorsModel {
            shards,
            shard_of,
            names,
        })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The opened shard files (one for a single-file model).
    pub fn shards(&self) -> &[SafetensorsFile] {
        &self.shards
    }

    /// Paths of the shard files.
    pub fn shard_paths(&self) -> Vec<PathBuf> {
        self.shards
            .iter()
            .filter_map(|s| s.path().map(Path::to_path_buf))
            .collect()
    }

    /// The shard that holds tensor `name`.
    pub fn shard_for(&self, name: &str) -> Result<&SafetensorsFile> {
        self.shard_of
            .get(name)
            .map(|&i| &self.shards[i])
            .ok_or_else(|| IoError::TensorNotFound {
                name: name.to_string(),
            })
    }

    /// The info of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Result<&SafetensorInfo> {
        self.shard_for(name)?.tensor_info(name)
    }

    /// The raw bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8]> {
        self.shard_for(name)?.tensor_bytes(name)
    }

    /// Tensor `name` as graph input data, without a copy (see
    /// [`SafetensorsFile::tensor_data`]).
    pub fn tensor_data(&self, name: &str) -> Result<luminal::HostData> {
        self.shard_for(name)?.tensor_data(name)
    }

    /// Tensor `name` converted to f32 (from F32, F16 or BF16).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.shard_for(name)?.tensor_f32(name)
    }

    /// Like [`SafetensorsModel::tensor_f32`], but first checks that the shape is `expected`.
    pub fn tensor_f32_with_shape(&self, name: &str, expected: &[usize]) -> Result<Vec<f32>> {
        check_shape(self.tensor_info(name)?, expected)?;
        self.tensor_f32(name)
    }
}

/// Shard names must stay inside the model directory: plain relative paths, no `..`.
fn check_shard_name(file: &str) -> Result<()> {
    let path = Path::new(file);
    let plain = !file.is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if plain {
        Ok(())
    } else {
        Err(IoError::BadIndex {
            reason: format!(
                "shard file name {file:?} is not a relative path inside the model directory"
            ),
        })
    }
}
