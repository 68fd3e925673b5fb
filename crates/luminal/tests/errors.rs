//! Every typed run-time error, and the panics of wrongly built graphs.

use luminal::prelude::*;

fn compile(cx: &Graph) -> ReferenceRuntime {
    cx.compile(ReferenceBackend, CompileOptions::default())
        .unwrap()
}

#[test]
fn wrong_length_on_set() {
    let cx = Graph::new();
    let a = cx.tensor("a", (2, 3));
    let _ = (a * 2.0).output();
    let mut rt = compile(&cx);
    let err = rt.set(a, &[1.0f32; 5]).unwrap_err();
    assert_eq!(
        err,
        LuminalError::WrongLength {
            tensor: "a".into(),
            expected: 6,
            got: 5
        }
    );
    assert!(err.to_string().contains("expected 6 elements, got 5"));
}

#[test]
fn wrong_length_with_dynamic_dim_is_caught_at_run() {
    let cx = Graph::new();
    let a = cx.tensor("a", ("seq", 2));
    let b = (a + 1.0).output();
    let mut rt = compile(&cx);
    rt.set(a, &[1.0f32; 6]).unwrap(); // seq unknown yet: accepted for now
    rt.set_dim("seq", 2);
    assert!(matches!(
        rt.run(),
        Err(LuminalError::WrongLength {
            expected: 4,
            got: 6,
            ..
        })
    ));
    rt.set_dim("seq", 3);
    rt.run().unwrap();
    assert_eq!(rt.get::<f32>(b).unwrap(), vec![2.0; 6]);
}

#[test]
fn wrong_dtype_on_set_and_get() {
    let cx = Graph::new();
    let a = cx.input("a", 3, DType::I32);
    let b = (a * 2).output();
    let mut rt = compile(&cx);
    assert!(matches!(
        rt.set(a, &[1.0f32, 2.0, 3.0]),
        Err(LuminalError::WrongDType {
            expected: DType::I32,
            got: DType::F32,
            ..
        })
    ));
    rt.set(a, &[1i32, 2, 3]).unwrap();
    rt.run().unwrap();
    assert!(matches!(
        rt.get::<f32>(b),
        Err(LuminalError::WrongDType { .. })
    ));
    assert_eq!(rt.get::<i32>(b).unwrap(), vec![2, 4, 6]);
    assert_eq!(rt.get_f32(b).unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn unknown_tensor_from_another_graph_or_after_compile() {
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let _ = a.sqrt().output();
    let mut rt = compile(&cx);
    let other = Graph::new();
    let x = other.tensor("x", 2);
    assert!(matches!(
        rt.set(x, &[1.0f32, 2.0]),
        Err(LuminalError::UnknownTensor(_))
    ));
    let late = cx.tensor("late", 2);
    assert!(matches!(
        rt.set(late, &[1.0f32, 2.0]),
        Err(LuminalError::UnknownTensor(_))
    ));
}

#[test]
fn set_on_a_computed_tensor_or_a_view_is_not_an_input() {
    let cx = Graph::new();
    let a = cx.tensor("a", (2, 2));
    let b = (a + 1.0).output();
    let at = a.permute(&[1, 0]);
    let mut rt = compile(&cx);
    assert!(matches!(
        rt.set(b, &[0.0f32; 4]),
        Err(LuminalError::NotAnInput(_))
    ));
    assert!(matches!(
        rt.set(at, &[0.0f32; 4]),
        Err(LuminalError::NotAnInput(_))
    ));
}

#[test]
fn get_requires_output_and_a_run() {
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let hidden = a.exp2();
    let shown = (hidden + 1.0).output();
    let mut rt = compile(&cx);
    rt.set(a, &[0.0f32, 1.0]).unwrap();
    assert!(matches!(
        rt.get::<f32>(shown),
        Err(LuminalError::NotComputed(_))
    ));
    rt.run().unwrap();
    assert!(matches!(
        rt.get::<f32>(hidden),
        Err(LuminalError::NotAnOutput(_))
    ));
    assert_eq!(rt.get::<f32>(shown).unwrap(), vec![2.0, 3.0]);
}

#[test]
fn missing_input() {
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let b = cx.tensor("b", 2);
    let _ = (a + b).output();
    let mut rt = compile(&cx);
    rt.set(a, &[1.0f32, 2.0]).unwrap();
    assert_eq!(rt.run(), Err(LuminalError::MissingInput("b".into())));
}

#[test]
fn unused_input_is_not_required() {
    let cx = Graph::new();
    let a = cx.tensor("a", 2);
    let unused = cx.tensor("unused", 2);
    let b = (a * 3.0).output();
    let mut rt = compile(&cx);
    rt.set(a, &[1.0f32, 2.0]).unwrap();
    rt.set(unused, &[1.0f32, 2.0]).unwrap();
    rt.run().unwrap();
    assert_eq!(rt.get::<f32>(b).unwrap(), vec![3.0, 6.0]);
}

#[test]
fn unbound_dim() {
    let cx = Graph::new();
    let a = cx.tensor("a", ("batch", 2));
    let _ = a.sum(0).output();
    let mut rt = compile(&cx);
    rt.set(a, &[1.0f32; 4]).unwrap();
    let err = rt.run().unwrap_err();
    assert_eq!(err, LuminalError::UnboundDim("batch".into()));
    assert!(err.to_string().contains("set_dim(\"batch\""));
}

#[test]
fn gather_index_out_of_range() {
    let cx = Graph::new();
    let table = cx.tensor("table", (3, 2));
    let ids = cx.input("ids", 2, DType::I32);
    let _ = table.embedding(ids).output();
    let mut rt = compile(&cx);
    rt.set(table, &[0.0f32; 6]).unwrap();
    rt.set(ids, &[0i32, 3]).unwrap();
    assert_eq!(
        rt.run(),
        Err(LuminalError::IndexOutOfRange {
            op: "Gather".into(),
            index: 3,
            size: 3
        })
    );
    rt.set(ids, &[-1i32, 0]).unwrap();
    assert!(matches!(
        rt.run(),
        Err(LuminalError::IndexOutOfRange { index: -1, .. })
    ));
}

#[test]
#[should_panic(expected = "Add: cannot broadcast shapes [2, 3] and [4]")]
fn broadcast_mismatch_panics_with_op_and_shapes() {
    let cx = Graph::new();
    let _ = cx.tensor("a", (2, 3)) + cx.tensor("b", 4);
}

#[test]
#[should_panic(expected = "matmul: inner dims differ for shapes [2, 3] and [4, 5]")]
fn matmul_mismatch_panics() {
    let cx = Graph::new();
    let _ = cx.tensor("a", (2, 3)).matmul(cx.tensor("b", (4, 5)));
}

#[test]
#[should_panic(expected = "sum: axis 2 is out of range for shape [2, 3]")]
fn bad_axis_panics() {
    let cx = Graph::new();
    let _ = cx.tensor("a", (2, 3)).sum(2);
}

#[test]
#[should_panic(expected = "reshape: cannot reshape shape [2, 3] (6 elements) to [4]")]
fn bad_reshape_panics() {
    let cx = Graph::new();
    let _ = cx.tensor("a", (2, 3)).reshape(4);
}

#[test]
#[should_panic(expected = "Log2: needs a float tensor")]
fn float_op_on_ints_panics() {
    let cx = Graph::new();
    let _ = cx.input("a", 2, DType::I32).log2();
}

#[test]
#[should_panic(expected = "an input named 'a' already exists")]
fn duplicate_input_name_panics() {
    let cx = Graph::new();
    let _ = cx.tensor("a", 2);
    let _ = cx.tensor("a", 3);
}
